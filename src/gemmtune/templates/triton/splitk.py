"""The `triton_splitk` template: deterministic two-pass split-K GEMM for long K and small outputs.

When M x N gives too few output tiles to fill the GPU while K is long (decode-time `nn.Linear`
with M = 1..16, or M = N = 256 with K = 65536), a plain GEMM runs a handful of programs each
walking all of K.  Split-K cuts K into SPLIT_K slices, computes fp32 partial tiles in parallel
into a workspace `[batch, SPLIT_K, M, N]`, then a reduce kernel sums them in a fixed order
(bitwise reproducible, no atomics), applies alpha / beta * bias and casts.

Compile-time config: BLOCK_M/N/K, SPLIT_K, num_stages, num_warps.  Runtime: `swizzle` (GROUP_M),
M, N, K, strides.  Offered only where `splitk_worthwhile` says split-K can win (a template built
with `force=True`, or with its own `offer` rule, overrides that, e.g. for tests).

Example:
    >>> from gemmtune.templates.triton.splitk import splitk_worthwhile, config_space
    >>> splitk_worthwhile(16, 4096, 14336), splitk_worthwhile(4096, 4096, 4096)
    (True, False)
    >>> len(config_space()) <= 48 < 100 <= len(config_space("max"))
    True
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping, Sequence

import torch

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import Launcher, pow2_at_least, split_operands
from .base import (ACC_REGS_MAX, DEFAULT_SMEM, STAGE1_SWIZZLE, TILE_KEYS, KernelLaunch, TritonTemplate, acc_regs,
                   batch_strides, bias_args, cdiv, check_size, epilogue_flags, fit_tiles, input_precision, output,
                   pipeline_smem, smem_limit, warmed)

SPLITS = (2, 4, 8, 16)
WORKSPACE_LIMIT = 256 * 2**20  # bytes of fp32 partials; larger splits are dropped


def splitk_worthwhile(M: int, N: int, K: int, batch: int = 1) -> bool:
    """Whether split-K can beat a one-pass GEMM: K long relative to the output.

    True when K >= 1024 and either K >= 4 * max(M, N) (every output element needs a long dot
    product) while the output has at most 2**22 elements (256 tiles of 128 x 128, two waves on an
    H200), or the output is small (batch * M * N <= 2**20 elements: 64 such tiles, half the SMs)
    and K >= 2048.  Shorter K does not pay for the second (reduce) launch.

    Example:
        >>> splitk_worthwhile(256, 256, 65536), splitk_worthwhile(1, 4096, 4096)
        (True, True)
        >>> splitk_worthwhile(4096, 14336, 4096), splitk_worthwhile(128, 28672, 4096)
        (False, False)
    """
    out = batch * M * N
    return K >= 1024 and (K >= 4 * max(M, N) and out <= 2**22 or out <= 2**20 and K >= 2048)


def config_space(size: str = "default") -> list[dict[str, int]]:
    """Compile-time configs before fitting: `"default"` (48) or `"max"` (about 500).

    Example:
        >>> {c["SPLIT_K"] for c in config_space()} == set(SPLITS)
        True
    """
    check_size(size)
    if size == "default":
        tiles = ((16, 64), (32, 64), (64, 64), (64, 128), (128, 64), (128, 128))
        return [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=stages,
                     num_warps=8 if bm * bn > 64 * 128 else 4)
                for bm, bn in tiles for bk, stages in ((64, 4), (128, 3)) for split in SPLITS]
    space = []
    for bm, bn, bk, stages, warps in itertools.product((16, 32, 64, 128), (32, 64, 128, 256), (32, 64, 128),
                                                       (2, 3, 4, 5), (4, 8)):
        if acc_regs(bm, bn, warps) > ACC_REGS_MAX or warps == 8 and bm * bn < 64 * 128:
            continue
        if pipeline_smem(stages, bm, bn, bk) > DEFAULT_SMEM or stages == 2 and bk < 128 or stages == 5 and bk > 32:
            continue
        if bk == 32 and stages < 4 or bn == 256 and bm > 64:
            continue
        space += [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=stages, num_warps=warps)
                  for split in SPLITS]
    return space


def fit_configs(space: Sequence[Mapping[str, int]], M: int, N: int, K: int, elt_bytes: int, smem_limit: int,
                batch: int = 1) -> list[dict[str, int]]:
    """Clamp tiles to the problem (min 16); drop duplicates, configs over shared memory, splits that
    leave a slice without a K step, and workspaces over `WORKSPACE_LIMIT`.

    Example:
        >>> cfg = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=128, SPLIT_K=16, num_stages=3, num_warps=4)
        >>> fit_configs([cfg], 16, 4096, 14336, 2, 232448)[0]["BLOCK_M"]
        16
        >>> fit_configs([cfg], 16, 4096, 1024, 2, 232448)   # 8 K steps cannot feed 16 slices
        []
    """
    return [c for c in fit_tiles(space, M, N, K, elt_bytes, smem_limit)
            if cdiv(K, c["BLOCK_K"]) >= c["SPLIT_K"] and batch * c["SPLIT_K"] * M * N * 4 <= WORKSPACE_LIMIT]


def _reduce_tile(M: int, N: int) -> tuple[int, int]:
    """The reduce kernel's tile: up to 32 x 128 fp32 (16 KiB of partials per slice), at least 8 x 16."""
    return min(32, max(8, pow2_at_least(M))), min(128, max(16, pow2_at_least(N)))


class TritonSplitKTemplate(TritonTemplate):
    """Split-K Triton mm/addmm/bmm for fp16, bf16 and fp32 (tf32 following torch's setting).

    `force=True` offers it for every problem (tests); `offer(ki) -> bool` replaces the rule.

    Example:
        >>> import torch
        >>> from gemmtune.core.inputs import KernelInputs
        >>> ki = KernelInputs.from_tensors("mm", torch.ones(4, 256), torch.ones(256, 4))
        >>> TritonSplitKTemplate().offered(ki), TritonSplitKTemplate(force=True).compile_configs(ki)[0]["SPLIT_K"]
        (False, 2)
    """

    uid = "triton_splitk"
    kernel_file = "splitk_kernel.py"
    config_space = staticmethod(config_space)

    def __init__(self, space: Sequence[Mapping[str, int]] | None = None, size: str = "default",
                 force: bool = False, offer: Callable[[KernelInputs], bool] | None = None):
        super().__init__(space, size)
        self.offer = (lambda ki: True) if force else offer

    def offered(self, ki: KernelInputs) -> bool:
        """The template's rule (default `splitk_worthwhile`) for this problem."""
        if self.offer is not None:
            return bool(self.offer(ki))
        return splitk_worthwhile(ki.M, ki.N, ki.K, ki.batch)

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        return fit_configs(self.space, ki.M, ki.N, ki.K, ki.dtype.itemsize, smem_limit(ki.device), ki.batch)

    def workspace(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """fp32 partials `[batch, SPLIT_K, M, N]`, fresh per launch (the caching allocator makes it cheap)."""
        return torch.empty(shape, dtype=torch.float32, device=device)

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        from .splitk_kernel import splitk_partial_kernel, splitk_reduce_kernel

        cfg = choice.config_dict
        split = cfg["SPLIT_K"]
        M, N, K, batch = ki.M, ki.N, ki.K, ki.batch
        rbm, rbn = _reduce_tile(M, N)
        partial = KernelLaunch(splitk_partial_kernel, (cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]), split, batch),
                               dict({k: cfg[k] for k in TILE_KEYS}, SPLIT_K=split,
                                    INPUT_PRECISION=input_precision(ki.dtype)))
        reduce = KernelLaunch(splitk_reduce_kernel, (cdiv(M, rbm) * cdiv(N, rbn), batch, 1),
                              dict(SPLIT_K=split, BLOCK_M=rbm, BLOCK_N=rbn, num_warps=4, **epilogue_flags(ki)))
        ws_shape, ws_strides = (batch, split, M, N), (split * M * N, M * N, N)

        def args(tensors, out, ws, swizzle):
            bias, a, b = split_operands(ki, tensors)
            bias, sbias = bias_args(bias, out, M, N)
            first = (a, b, ws, M, N, K, *batch_strides(a), *batch_strides(b), *ws_strides, swizzle)
            second = (ws, out, bias, M, N, *ws_strides, *batch_strides(out), *sbias, ki.alpha, ki.beta)
            return first, second

        def launch(tensors, out=None, swizzle=STAGE1_SWIZZLE):
            out = output(ki, tensors, out)
            first, second = args(tensors, out, self.workspace(ws_shape, tensors[-1].device), swizzle)
            partial(first)
            reduce(second)
            return out

        def warm_up_args(out):
            dummy_ws = torch.empty(1, dtype=torch.float32, device=out.device)  # only its type and alignment matter
            return args(example, out, dummy_ws, STAGE1_SWIZZLE)

        partial, reduce = warmed(ki, example, warm_up_args, partial, reduce)
        return launch
