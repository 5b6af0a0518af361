"""The `triton_mm` template: tiled GEMM with a runtime tile swizzle.

Compile-time config: BLOCK_M/N/K, num_stages, num_warps.  Runtime params:
`swizzle` (GROUP_M).  Configs are fitted to the problem: tiles are clamped to
the problem's size, duplicates removed, and configs over the device's shared
memory or the accumulator register budget dropped.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping, Sequence

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import pow2_at_least, unique_configs
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

NARROW, WIDE = 128, 16384
"""An output this narrow on one side (M or N) and this wide on the other is a narrow problem: the vision
models' convolutions as GEMMs (M of 10^5-10^6, N and K of 16-128) and their transposes."""


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

    Example:
        >>> import torch
        >>> ki = KernelInputs.from_tensors("mm", torch.ones(8, 72), torch.ones(20, 72).t())
        >>> stride_divisors(ki)
        {'DIV_AM': 8, 'DIV_AK': 1, 'DIV_BK': 1, 'DIV_BN': 8, 'DIV_CM': 1, 'DIV_CN': 1}
    """
    def div(stride: int) -> int:
        return 16 if stride % 16 == 0 else stride & -stride

    a, b = ki.a.stride[-2:], ki.b.stride[-2:]
    return dict(DIV_AM=div(a[0]), DIV_AK=div(a[1]), DIV_BK=div(b[0]), DIV_BN=div(b[1]), DIV_CM=1, DIV_CN=1)


def wraps(ki: KernelInputs, divisors: dict[str, int]) -> dict[str, int]:
    """The mm kernel's WRAP_M and N_WRAP: where a contiguous dimension's tile indices wrap around.  Along
    A's M where A is column-major, and B's N where B is row-major, the elements are contiguous, so the
    compiler loads them in vectors of up to the row stride's alignment (`divisors`); the wrap then comes
    at the next multiple of it, never inside a vector (an odd N, as a padded twin's B seen through its
    first N columns, would start the wrapped part at a misaligned address).  The row stride is itself
    such a multiple, so the columns read past the edge stay inside each row.

    Example:
        >>> import torch
        >>> storage = torch.ones(64, 5568, dtype=torch.bfloat16)
        >>> ki = KernelInputs.from_tensors("mm", torch.ones(8, 64, dtype=torch.bfloat16), storage[:, :5555])
        >>> wraps(ki, stride_divisors(ki))
        {'WRAP_M': 1, 'N_WRAP': 5568}
    """
    n_align = divisors["DIV_BK"] if ki.b.stride[-1] == 1 else 1
    return dict(WRAP_M=divisors["DIV_AK"] if ki.a.stride[-2] == 1 else 1, N_WRAP=-(-ki.N // n_align) * n_align)


STRIDE_ARGS = ((8, "DIV_AM"), (9, "DIV_AK"), (11, "DIV_BK"), (12, "DIV_BN"))
"""Where the mm kernel's arguments hold each matrix stride, and the DIV_* it was built for."""


def checked_strides(meta: dict[str, Any], args: tuple) -> tuple:
    """`args` (the mm kernel's) unchanged, after checking each matrix stride is a multiple of its DIV_*: a
    binary built for one problem's strides must not run on strides it would misread (M, N and K come
    from the problem the launcher was built for).  Four modulos per call: it runs on every timed launch."""
    if args[8] % meta["DIV_AM"] or args[9] % meta["DIV_AK"] or args[11] % meta["DIV_BK"] or args[12] % meta["DIV_BN"]:
        i, name = next((i, name) for i, name in STRIDE_ARGS if args[i] % meta[name])
        raise RuntimeError(f"triton_mm: a stride of {args[i]} is not a multiple of the {meta[name]} this kernel "
                           f"was built for ({name}); tune the problem with these strides")
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

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        space = [*self.space, *narrow_configs(ki.M, ki.N, ki.K)]
        return fit_configs(space, ki.M, ki.N, ki.K, ki.dtype.itemsize, smem_limit(ki.device))

    traceable = True

    def launch_spec(self, choice: Choice, ki: KernelInputs) -> tuple[KernelLaunch, Callable[..., tuple]]:
        from .mm_kernel import gemm_kernel

        cfg = choice.config_dict
        meta = dict({k: cfg[k] for k in TILE_KEYS}, **epilogue_flags(ki), INPUT_PRECISION=input_precision(ki.dtype),
                    EVEN_K=ki.K % cfg["BLOCK_K"] == 0, **(div := stride_divisors(ki)), **wraps(ki, div), N_FIXED=ki.N,
                    K_FIXED=ki.K)
        run = KernelLaunch(gemm_kernel, (cdiv(ki.M, cfg["BLOCK_M"]) * cdiv(ki.N, cfg["BLOCK_N"]), ki.batch, 1), meta)
        return run, lambda tensors, out, swizzle=STAGE1_SWIZZLE: checked_strides(meta, (*gemm_args(ki, tensors, out),
                                                                                         swizzle))
