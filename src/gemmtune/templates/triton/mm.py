"""The `triton_mm` template: tiled GEMM with a runtime tile swizzle.

Compile-time config: BLOCK_M/N/K, num_stages, num_warps.  Runtime params:
`swizzle` (GROUP_M).  Configs are fitted to the problem: tiles are clamped to
the problem's size, duplicates removed, and configs over the device's shared
memory or the accumulator register budget dropped.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, Callable, Mapping, Sequence

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import NARROW, WIDE, pow2_at_least, unique_configs
from .base import (ACC_REGS_MAX, DEFAULT_SMEM, TILE_KEYS, KernelLaunch, TritonTemplate, acc_regs, cdiv, check_size,
                   epilogue_flags, fit_tiles, gemm_args, input_precision, pipeline_smem, smem_limit, STAGE1_SWIZZLE)

_TILES_MN = (16, 32, 64, 128, 256)
_TILES_N = (32, 64, 128, 256)
_TILES_K = (32, 64, 128)
_STAGES = (3, 4, 5)
_WARPS = (4, 8)

def config_space(size: str = "default") -> list[dict[str, int]]:
    """The full compile-time space before it is fitted to a problem.

    `"default"` (150 configs) is what `TritonMMTemplate()` uses; `"max"` is a superset of it
    (about 380 configs: 2 and 6 stages, 2 warps, 16-wide, 16- and 256-deep tiles) for an
    exhaustive effort level.

    Example:
        >>> len(config_space()), len(config_space("max")) >= 100
        (150, True)
        >>> all(c in config_space("max") for c in config_space())
        True
    """
    check_size(size)
    return _default_space() if size == "default" else _max_space()

def _default_space() -> list[dict[str, int]]:
    space = []
    for bm, bn, bk, stages, warps in itertools.product(_TILES_MN, _TILES_N, _TILES_K, _STAGES, _WARPS):
        tile = bm * bn
        if warps == 8 and tile < 128 * 64:
            continue  # 8 warps on a small tile leave warps idle
        if warps == 4 and tile > 128 * 128:
            continue
        if acc_regs(bm, bn, warps) > ACC_REGS_MAX:
            continue
        if stages == 5 and bk > 32 or stages == 3 and bk == 32 and tile > 64 * 64 or bk == 128 and tile > 64 * 128:
            continue
        space.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps))
    return space

def _max_space() -> list[dict[str, int]]:
    """The default space plus a looser grid; only the accumulator and shared-memory limits prune."""
    extra = []
    tiles = (16, 32, 64, 128, 256)
    for bm, bn, bk, stages, warps in itertools.product(tiles, tiles, tiles, (2, 3, 4, 5, 6), (2, 4, 8)):
        tile = bm * bn
        if not 4 <= acc_regs(bm, bn, warps) <= ACC_REGS_MAX:
            continue  # idle threads, or the accumulator spills
        if tile < 16 * 64 or warps == 2 and tile > 32 * 32 or warps == 8 and tile < 64 * 128:
            continue
        if pipeline_smem(stages, bm, bn, bk) > DEFAULT_SMEM or bk >= 128 and tile > 64 * 128:
            continue
        if (bk == 16 or bk == 256) and tile > 32 * 64 or bk == 16 and stages < 4:
            continue  # 16-deep and 256-deep steps only for skinny tiles
        if stages == 6 and bk > 32 or stages == 2 and bk < 64 or stages == 5 and bk > 64:
            continue  # shallow pipelines only pay with deep K steps, and vice versa
        extra.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps))
    return unique_configs(_default_space() + extra)

def narrow_configs(M: int, N: int, K: int) -> list[dict[str, int]]:
    """Tiles for a narrow problem (else none): the whole narrow side in one tile and a tall tile along the
    wide side (up to 512), so each program reads its rows of A once and writes whole output rows; 8
    warps even on a small tile, and a K step of 32 or the whole K (Inductor's picks on these problems).

    Example:
        >>> cfgs = narrow_configs(1605632, 32, 16)
        >>> sorted({(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]) for c in cfgs})[-1], narrow_configs(4096, 32, 16)
        ((512, 32, 16), [])
    """
    if min(M, N) > NARROW or max(M, N) < WIDE:
        return []
    side = max(16, pow2_at_least(min(M, N)))
    out = []
    for long, warps, stages, bk in itertools.product((64, 128, 256, 512), (4, 8), (3, 4), (32, 128)):
        if acc_regs(long, side, warps) > ACC_REGS_MAX or warps == 8 and long < 128:
            continue
        bk = min(bk, max(16, pow2_at_least(K)))
        bm, bn = (long, side) if N <= M else (side, long)
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps))
    return out


def fit_configs(space: Sequence[Mapping[str, int]], M: int, N: int, K: int, elt_bytes: int,
                smem_limit: int) -> list[dict[str, int]]:
    """Clamp tiles to the problem (min 16), drop duplicates and configs over shared memory.

    Example:
        >>> len(fit_configs(config_space(), 16, 4096, 4096, 2, 232448)) < len(config_space())
        True
    """
    return fit_tiles(space, M, N, K, elt_bytes, smem_limit)

def stride_divisors(ki: KernelInputs) -> dict[str, int]:
    """The mm kernel's DIV_* constexprs: of each matrix stride, the largest power of two (up to 16) that
    divides it, so the compiler knows each row's alignment (Triton's own specialization knows only 16).
    The output is row-major (its launcher allocates it so, and Inductor's buffer for a generated pick is a
    row-major layout): its row stride is N, and a stride of 1 Triton specializes itself (DIV_CN = 1).
    Told that an output row of N = 24 starts 16-byte aligned, the kernel stores it in vectors.

    Example:
        >>> import torch
        >>> ki = KernelInputs.from_tensors("mm", torch.ones(8, 72), torch.ones(20, 72).t())
        >>> stride_divisors(ki)
        {'DIV_AM': 8, 'DIV_AK': 1, 'DIV_BK': 1, 'DIV_BN': 8, 'DIV_CM': 4, 'DIV_CN': 1}
    """
    def div(stride: int) -> int:
        return 16 if stride % 16 == 0 else stride & -stride

    a, b = ki.a.stride[-2:], ki.b.stride[-2:]
    return dict(DIV_AM=div(a[0]), DIV_AK=div(a[1]), DIV_BK=div(b[0]), DIV_BN=div(b[1]), DIV_CM=div(ki.N), DIV_CN=1)


def index_hints(ki: KernelInputs, block_m: int, block_n: int, div_bk: int, whole_rows: bool = False) -> dict[str, int]:
    """The mm kernel's N_WRAP, HINT_M, HINT_N and CLAMP_M.  Tile indices past M and N wrap around (rows past
    M of an A that is not column-major are clamped to its last row: CLAMP_M); the hints tell the
    compiler they run contiguous in groups, so it loads A's columns (A column-major) and B's rows (B
    row-major) in vectors.  A group must never span the wrap (a vector would start at a misaligned
    address): along a dimension contiguous in memory the hint is the power of two dividing where it wraps,
    at most the block.  `whole_rows` (a padded twin's operands): B's rows wrap at N rounded up to their
    alignment `div_bk`, inside each row's storage, so an odd N still loads in vectors.

    Example:
        >>> import torch
        >>> bf16 = dict(dtype=torch.bfloat16)
        >>> a, storage = torch.ones(777, 64, **bf16), torch.ones(64, 5568, **bf16)
        >>> ki = KernelInputs.from_tensors("mm", a, storage[:, :5555])
        >>> index_hints(ki, 128, 128, 16)
        {'N_WRAP': 5555, 'HINT_M': 128, 'HINT_N': 1, 'CLAMP_M': True}
        >>> index_hints(ki, 128, 128, 16, whole_rows=True)
        {'N_WRAP': 5568, 'HINT_M': 128, 'HINT_N': 64, 'CLAMP_M': True}
        >>> index_hints(KernelInputs.from_tensors("mm", a.t().contiguous().t(), storage), 128, 128, 16)["HINT_M"]
        1
    """
    row_b = ki.b.stride[-1] == 1
    n_wrap = -(-ki.N // div_bk) * div_bk if whole_rows and row_b else ki.N
    col_a = ki.a.stride[-2] == 1
    hint_m = min(block_m, ki.M & -ki.M) if col_a else block_m
    return dict(N_WRAP=n_wrap, HINT_M=max(1, hint_m), HINT_N=min(block_n, n_wrap & -n_wrap) if row_b else block_n,
                CLAMP_M=not col_a)


STRIDE_ARGS = ((8, "DIV_AM"), (9, "DIV_AK"), (11, "DIV_BK"), (12, "DIV_BN"), (14, "DIV_CM"))
"""Where the mm kernel's arguments hold each matrix stride, and the DIV_* it was built for."""


def checked_strides(meta: dict[str, Any], args: tuple) -> tuple:
    """`args` (the mm kernel's) unchanged, after checking each matrix stride is a multiple of its DIV_*: a
    binary built for one problem's strides must not run on strides it would misread (M, N and K come
    from the problem the launcher was built for), and, for a column-major A, that M is a multiple of the rows
    it loads at once (HINT_M).  A few modulos per call: it runs on every timed launch."""
    if args[8] == 1 and args[4] % meta["HINT_M"]:  # a column-major A's rows load in runs of HINT_M
        raise RuntimeError(f"triton_mm: M = {args[4]} is not a multiple of the {meta['HINT_M']} rows this kernel "
                           "loads at once; tune the problem with this M")
    if (args[8] % meta["DIV_AM"] or args[9] % meta["DIV_AK"] or args[11] % meta["DIV_BK"] or args[12] % meta["DIV_BN"]
            or args[14] % meta["DIV_CM"] and args[4] > 1):  # one output row: its stride is never used
        i, name = next((i, name) for i, name in STRIDE_ARGS if args[i] % meta[name])
        fix = "pass a row-major output" if name == "DIV_CM" else "tune the problem with these strides"
        raise RuntimeError(f"triton_mm: a stride of {args[i]} is not a multiple of the {meta[name]} this kernel "
                           f"was built for ({name}); {fix}")
    return args


class TritonMMTemplate(TritonTemplate):
    """Triton mm/addmm/bmm for fp16, bf16 and fp32 (tf32 following torch's setting).

    Example:
        >>> len(TritonMMTemplate().space), TritonMMTemplate.default_runtime
        (150, {'swizzle': 8})
    """

    uid = "triton_mm"
    kernel_file = "mm_kernel.py"
    config_space = staticmethod(config_space)
    whole_rows = False  # operands in whole rows of aligned storage (`on_padded_storage`)

    def on_padded_storage(self) -> "TritonMMTemplate":
        twin_inner = copy.copy(self)
        twin_inner.whole_rows = True
        return twin_inner

    def out_fits(self, ki: KernelInputs) -> Callable[[Any], bool]:
        """An output fits where its rows keep the alignment the binary was built for (DIV_CM), or it has
        one row; another (a column-major `out`) is written through a row-major one (`swizzled_launcher`)."""
        div = stride_divisors(ki)["DIV_CM"]
        return lambda out: ki.M == 1 or out.stride(-2) % div == 0

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        space = [*self.space, *narrow_configs(ki.M, ki.N, ki.K)]
        return fit_configs(space, ki.M, ki.N, ki.K, ki.dtype.itemsize, smem_limit(ki.device))

    traceable = True

    def launch_spec(self, choice: Choice, ki: KernelInputs) -> tuple[KernelLaunch, Callable[..., tuple]]:
        from .mm_kernel import gemm_kernel

        cfg = choice.config_dict
        meta = dict({k: cfg[k] for k in TILE_KEYS}, **epilogue_flags(ki), INPUT_PRECISION=input_precision(ki.dtype),
                    EVEN_K=ki.K % cfg["BLOCK_K"] == 0, **(div := stride_divisors(ki)), N_FIXED=ki.N, K_FIXED=ki.K,
                    **index_hints(ki, cfg["BLOCK_M"], cfg["BLOCK_N"], div["DIV_BK"], self.whole_rows))
        run = KernelLaunch(gemm_kernel, (cdiv(ki.M, cfg["BLOCK_M"]) * cdiv(ki.N, cfg["BLOCK_N"]), ki.batch, 1), meta)
        return run, lambda tensors, out, swizzle=STAGE1_SWIZZLE: checked_strides(meta, (*gemm_args(ki, tensors, out),
                                                                                         swizzle))
