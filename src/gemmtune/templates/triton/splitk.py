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

import hashlib
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import Launcher, Template, split_operands
from .launch import FastLaunch
from .mm import fit_configs as plain_fit
from .mm import (SPACE_SIZES, STAGE1_SWIZZLE, SWIZZLES, _bstrides, _input_precision, _pow2_at_least,
                        _smem_limit, interpreting, triton_available, triton_cdiv)

KERNEL_FILE = Path(__file__).with_name("splitk_kernel.py")
SPLITS = (2, 4, 8, 16)
WORKSPACE_LIMIT = 256 * 2**20  # bytes of fp32 partials; larger splits are dropped
_ACC_REGS_MAX = 128


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
    if size not in SPACE_SIZES:
        raise ValueError(f"config_space: unknown size {size!r}; expected one of {', '.join(SPACE_SIZES)}")
    space = []
    if size == "default":
        tiles = ((16, 64), (32, 64), (64, 64), (64, 128), (128, 64), (128, 128))
        for bm, bn in tiles:
            for bk, stages in ((64, 4), (128, 3)):
                for split in SPLITS:
                    warps = 8 if bm * bn > 64 * 128 else 4
                    space.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=stages,
                                      num_warps=warps))
        return space
    for bm in (16, 32, 64, 128):
        for bn in (32, 64, 128, 256):
            for bk in (32, 64, 128):
                for stages in (2, 3, 4, 5):
                    for warps in (4, 8):
                        tile = bm * bn
                        if tile // (32 * warps) > _ACC_REGS_MAX or warps == 8 and tile < 64 * 128:
                            continue
                        if stages * (bm + bn) * bk * 2 > 232_448 or stages == 2 and bk < 128 or stages == 5 and bk > 32:
                            continue
                        if bk == 32 and stages < 4 or bn == 256 and bm > 64:
                            continue
                        for split in (2, 4, 8, 16):
                            space.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=stages,
                                              num_warps=warps))
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
    return [c for c in plain_fit(space, M, N, K, elt_bytes, smem_limit)
            if triton_cdiv(K, c["BLOCK_K"]) >= c["SPLIT_K"] and batch * c["SPLIT_K"] * M * N * 4 <= WORKSPACE_LIMIT]


def _reduce_tile(M: int, N: int) -> tuple[int, int]:
    """The reduce kernel's tile: up to 32 x 128 fp32 (16 KiB of partials per slice), at least 8 x 16."""
    return min(32, max(8, _pow2_at_least(M))), min(128, max(16, _pow2_at_least(N)))


class TritonSplitKTemplate(Template):
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
    family = "triton"
    src_hash = hashlib.sha256(KERNEL_FILE.read_bytes()).hexdigest()
    runtime_space = {"swizzle": SWIZZLES}
    default_runtime = {"swizzle": STAGE1_SWIZZLE}
    native_devices = ("cuda",)

    def __init__(self, space: Sequence[Mapping[str, int]] | None = None, size: str = "default",
                 force: bool = False, offer: Callable[[KernelInputs], bool] | None = None):
        self.space = list(space) if space is not None else config_space(size)
        self.offer = (lambda ki: True) if force else offer

    def offered(self, ki: KernelInputs) -> bool:
        """The template's rule (default `splitk_worthwhile`) for this problem."""
        if self.offer is not None:
            return bool(self.offer(ki))
        return splitk_worthwhile(ki.M, ki.N, ki.K, ki.batch)

    def supports(self, ki: KernelInputs) -> bool:
        if not triton_available() or ki.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return False
        if ki.device_type != "cuda" and not (ki.device_type == "cpu" and interpreting()):
            return False
        if max(ki.M * ki.K, ki.K * ki.N, ki.M * ki.N) >= 2**31:
            return False
        return self.offered(ki)

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        elt = torch.tensor([], dtype=ki.dtype).element_size()
        return fit_configs(self.space, ki.M, ki.N, ki.K, elt, _smem_limit(ki.device), ki.batch)

    def workspace(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """fp32 partials `[batch, SPLIT_K, M, N]`, fresh per launch (the caching allocator makes it cheap)."""
        return torch.empty(shape, dtype=torch.float32, device=device)

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        from .splitk_kernel import splitk_partial_kernel, splitk_reduce_kernel

        cfg = choice.config_dict
        bm, bn, bk, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
        M, N, K, batch, alpha, beta = ki.M, ki.N, ki.K, ki.batch, ki.alpha, ki.beta
        rbm, rbn = _reduce_tile(M, N)
        meta1 = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=cfg["num_stages"],
                     num_warps=cfg["num_warps"], INPUT_PRECISION=_input_precision(ki.dtype))
        meta2 = dict(SPLIT_K=split, BLOCK_M=rbm, BLOCK_N=rbn, num_warps=4,
                     HAS_BIAS=ki.op == "addmm" and beta != 0.0, SCALED=ki.op == "addmm" and alpha != 1.0)
        grid1 = (triton_cdiv(M, bm) * triton_cdiv(N, bn), split, batch)
        grid2 = (triton_cdiv(M, rbm) * triton_cdiv(N, rbn), batch, 1)
        ws_shape, ws_strides = (batch, split, M, N), (split * M * N, M * N, N)

        def args(tensors, out, ws, swizzle):
            bias, a, b = split_operands(ki, tensors)
            sc = _bstrides(out)
            if bias is not None:
                sbias = bias.expand(M, N).stride()
            else:
                bias, sbias = out, (0, 0)
            first = (a, b, ws, M, N, K, *_bstrides(a), *_bstrides(b), *ws_strides, swizzle)
            second = (ws, out, bias, M, N, *ws_strides, *sc, *sbias, alpha, beta)
            return first, second

        fast: list[FastLaunch | None] = [None, None]  # direct launch paths, built below

        def launch(tensors, out=None, swizzle=STAGE1_SWIZZLE):
            device = tensors[-1].device
            if out is None:
                out = torch.empty(ki.out_size, dtype=ki.dtype, device=device)
            first, second = args(tensors, out, self.workspace(ws_shape, device), swizzle)
            if fast[0] is None or not fast[0](first):
                splitk_partial_kernel[grid1](*first, **meta1)
            if fast[1] is None or not fast[1](second):
                splitk_reduce_kernel[grid2](*second, **meta2)
            return out

        if not interpreting():
            device = example[-1].device
            out = torch.empty(ki.out_size, dtype=ki.dtype, device=device)
            dummy_ws = torch.empty(1, dtype=torch.float32, device=device)  # only its type and alignment matter
            first, second = args(example, out, dummy_ws, STAGE1_SWIZZLE)
            with torch.cuda.device(device):
                for i, (kernel, a, grid, meta) in enumerate(((splitk_partial_kernel, first, grid1, meta1),
                                                             (splitk_reduce_kernel, second, grid2, meta2))):
                    compiled = kernel.warmup(*a, grid=grid, **meta)
                    init = getattr(compiled, "_init_handles", None)  # resource overflows surface here
                    if init is not None:
                        init()
                    fast[i] = FastLaunch.build(kernel, compiled, grid, meta, a)
        return launch
