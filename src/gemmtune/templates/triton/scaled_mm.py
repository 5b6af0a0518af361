"""The `triton_scaled_mm` template: fp8 `torch._scaled_mm` as a tiled Triton GEMM, scales in the epilogue.

Compile-time config: BLOCK_M/N/K, num_stages, num_warps (the problem adds its scale kind, bias and
`use_fast_accum`).  Runtime params: `swizzle` (GROUP_M), one binary for every swizzle.  Configs are
fitted to the problem as `triton_mm`'s are, with one-byte elements and BLOCK_K of at least 32 (the
depth of one fp8 tensor-core step).  It runs on CUDA devices of compute capability 8.9 or more (fp8
tensor cores) and, for tests, on the CPU through Triton's interpreter.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping, Sequence

import torch

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ...core.validate_fp8 import FP8_DTYPES
from ..base import unique_configs
from .base import (ACC_REGS_MAX, DEFAULT_SMEM, TILE_KEYS, KernelLaunch, TritonTemplate, acc_regs, cdiv, check_size,
                   fit_tiles, pipeline_smem, smem_limit, STAGE1_SWIZZLE)

_TILES_M = (16, 32, 64, 128, 256)
_TILES_N = (32, 64, 128, 256)
MIN_BLOCK_K = 32
SKINNY_M = 16
"""Problems of at most this many rows also get `skinny_space()`: on them a narrow tile over one or two
warps and a deep K step keeps more SMs busy than any tile of the main space."""
NARROW_OUTPUT = 128 * 64 * 32
"""Problems of more than `SKINNY_M` rows whose output is at most this many elements (fewer than 128 tiles of
64 x 32, under one wave of an H100's or H200's 132 SMs) also get `narrow_space()`."""
MAX_IMPRECISE = 128
"""Without fast accumulation, the K elements a tensor-core partial sum may span before float32 (the kernel's
`max_num_imprecise_acc`)."""
FP8_CAPABILITY = (8, 9)


def config_space(size: str = "default") -> list[dict[str, int]]:
    """The fp8 compile-time space before it is fitted to a problem: `"default"` or the larger `"max"`.

    Example:
        >>> len(config_space()) < len(config_space("max"))
        True
        >>> all(c in config_space("max") for c in config_space()) and min(c["BLOCK_K"] for c in config_space())
        64
    """
    check_size(size)
    if size == "default":
        return _space(_TILES_M, _TILES_N, (64, 128, 256), (3, 4, 5), (4, 8), strict=True)
    return unique_configs(_space(_TILES_M, _TILES_N, (64, 128, 256), (3, 4, 5), (4, 8), strict=True)
                          + _space(_TILES_M, _TILES_N, (32, 64, 128, 256), (2, 3, 4, 5, 6), (2, 4, 8), strict=False))


def skinny_space() -> list[dict[str, int]]:
    """The configs added for problems of at most `SKINNY_M` rows: 16 x 16 or 16 x 32 tiles on one or two
    warps, BLOCK_K 128 or 256, 4 or 5 stages (Inductor's fp8 search keeps such a config on M = 16).

    Example:
        >>> len(skinny_space()), {c["num_warps"] for c in skinny_space()}, {c["BLOCK_N"] for c in skinny_space()}
        (16, {1, 2}, {16, 32})
    """
    return [dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, num_stages=st, num_warps=w)
            for bn, bk, st, w in itertools.product((16, 32), (128, 256), (4, 5), (1, 2))]


def narrow_space() -> list[dict[str, int]]:
    """The configs added for small outputs of more than `SKINNY_M` rows (`NARROW_OUTPUT`): 32 x 16 and
    64 x 16 tiles on two or four warps, BLOCK_K 128 or 256, 4 or 5 stages.  Halving BLOCK_N doubles the
    tiles, so more SMs share the work (on an H100, Inductor's 64 x 16 kernel ran 128 x 1024 x 4096 row-wise
    in 12 % less time than the main space's best, `bench/compare.py`, 2026-12-05).

    Example:
        >>> len(narrow_space()), {c["BLOCK_N"] for c in narrow_space()}, {c["BLOCK_M"] for c in narrow_space()}
        (16, {16}, {32, 64})
    """
    return [dict(BLOCK_M=bm, BLOCK_N=16, BLOCK_K=bk, num_stages=st, num_warps=w)
            for bm, bk, st, w in itertools.product((32, 64), (128, 256), (4, 5), (2, 4))]


def _space(tiles_m: Sequence[int], tiles_n: Sequence[int], tiles_k: Sequence[int], stages: Sequence[int],
           warps: Sequence[int], strict: bool) -> list[dict[str, int]]:
    """The configs of the grid within the accumulator and shared-memory limits; `strict` also drops
    the combinations that rarely pay (8 warps on small tiles, 4 on large ones, deep pipelines of
    deep K steps)."""
    space = []
    for bm, bn, bk, st, w in itertools.product(tiles_m, tiles_n, tiles_k, stages, warps):
        tile = bm * bn
        if not 4 <= acc_regs(bm, bn, w) <= ACC_REGS_MAX or pipeline_smem(st, bm, bn, bk, 1) > DEFAULT_SMEM:
            continue
        if w == 2 and tile > 32 * 64 or bk == 256 and tile > 128 * 128:
            continue
        if strict and (w == 8 and tile < 128 * 64 or w == 4 and tile > 128 * 128 or st == 5 and bk > 128
                       or bk == 256 and tile > 64 * 128):
            continue
        space.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=st, num_warps=w))
    return space


def fit_configs(space: Sequence[Mapping[str, int]], M: int, N: int, K: int, smem: int) -> list[dict[str, int]]:
    """`space` fitted to an fp8 problem: tiles clamped to it (`fit_tiles`, one-byte elements), BLOCK_K
    raised to `MIN_BLOCK_K`, duplicates dropped.

    Example:
        >>> fit_configs([dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=128, num_stages=3, num_warps=4)], 5, 48, 16, DEFAULT_SMEM)
        [{'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 32, 'num_stages': 3, 'num_warps': 4}]
    """
    fitted = fit_tiles(space, M, N, K, 1, smem)
    return unique_configs(dict(c, BLOCK_K=max(c["BLOCK_K"], MIN_BLOCK_K)) for c in fitted)


def scaled_mm_args(ki: KernelInputs, tensors: Sequence[torch.Tensor], out: torch.Tensor, swizzle: int) -> tuple:
    """The kernel's runtime arguments: the operands, the scales, the bias (or `out`, never read without
    one), the sizes, the strides (the bias's too: a 1-D view may step over elements) and the swizzle."""
    a, b, scale_a, scale_b = tensors[:4]
    bias, bias_step = (tensors[4], tensors[4].stride(0)) if len(tensors) > 4 else (out, 1)
    return (a, b, out, scale_a, scale_b, bias, ki.M, ki.N, ki.K, *a.stride(), *b.stride(), *out.stride(), bias_step,
            swizzle)


class TritonScaledMMTemplate(TritonTemplate):
    """Triton fp8 scaled_mm: tensor-wise or row-wise scales and the bias applied in the epilogue.

    Example:
        >>> TritonScaledMMTemplate.ops, TritonScaledMMTemplate.default_runtime
        (('scaled_mm',), {'swizzle': 8})
    """

    uid = "triton_scaled_mm"
    kernel_file = "scaled_mm_kernel.py"
    config_space = staticmethod(config_space)
    ops = ("scaled_mm",)
    dtypes = FP8_DTYPES

    def __init__(self, space: Sequence[Mapping[str, int]] | None = None, size: str = "default"):
        """`space` replaces the compile-time space, skinny and narrow configs included; otherwise
        `config_space(size)`, with `skinny_space()` added on problems of at most `SKINNY_M` rows and
        `narrow_space()` on the other problems of at most `NARROW_OUTPUT` output elements."""
        super().__init__(space, size)
        self.skinny = [] if space is not None else skinny_space()
        self.narrow = [] if space is not None else narrow_space()

    def runs_on(self, ki: KernelInputs) -> bool:
        """A CUDA device with fp8 tensor cores (compute capability >= 8.9), or the CPU under the interpreter."""
        if ki.device_type == "cuda":
            return torch.cuda.is_available() and torch.cuda.get_device_capability(ki.device) >= FP8_CAPABILITY
        return super().runs_on(ki)

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        """The space fitted to the problem, with the skinny configs where it has at most `SKINNY_M` rows
        and the narrow ones where its output is small (`NARROW_OUTPUT`)."""
        extra = self.skinny if ki.M <= SKINNY_M else self.narrow if ki.M * ki.N <= NARROW_OUTPUT else []
        return fit_configs([*self.space, *extra], ki.M, ki.N, ki.K, smem_limit(ki.device))

    def launch_spec(self, choice: Choice, ki: KernelInputs) -> tuple[KernelLaunch, Callable[..., tuple]]:
        from .scaled_mm_kernel import scaled_mm_kernel

        cfg = choice.config_dict
        meta = dict({k: cfg[k] for k in TILE_KEYS}, ROWWISE=ki.scales == "rowwise", HAS_BIAS=ki.bias is not None,
                    EVEN_K=ki.K % cfg["BLOCK_K"] == 0, FAST_ACCUM=ki.fast_accum,
                    MAX_IMPRECISE=min(cfg["BLOCK_K"], MAX_IMPRECISE))
        run = KernelLaunch(scaled_mm_kernel, (cdiv(ki.M, cfg["BLOCK_M"]) * cdiv(ki.N, cfg["BLOCK_N"]), 1, 1), meta)
        return run, lambda tensors, out, swizzle=STAGE1_SWIZZLE: scaled_mm_args(ki, tensors, out, swizzle)
