"""The `triton_gemv` template: matrix-vector style kernels for M <= 4 (decode-time GEMV).

With one to four rows in A, an mm is bound by reading B once; a tensor-core tile of 16+ rows wastes
most of its work and cuBLAS's GEMV path leaves bandwidth unused on the H200 (Inductor's fused
reduction ran 11-27% faster than cuBLAS on the suite's M = 1 shapes, docs/ARCHITECTURE.md).  Each
program computes BLOCK_N outputs of one row (and batch), streaming B in BLOCK_N x BLOCK_K tiles.

Compile-time config: BLOCK_N, BLOCK_K, num_warps.  Runtime: M, N, K and every stride (no runtime
tuning parameter: the grid is one program per BLOCK_N outputs per row).  mm / addmm / bmm, fp16,
bf16, fp32 (fp32 products, never tf32), any strides.

On an H200 its narrow long-K configs beat cuBLAS on three of the suite's four M = 1 shapes
(docs/ARCHITECTURE.md), so it is in the default pool (Hopper set).

Example:
    >>> import torch
    >>> from gemmtune.core.inputs import KernelInputs
    >>> rows = lambda m: KernelInputs.from_tensors("mm", torch.ones(m, 64), torch.ones(64, 8))
    >>> [TritonGemvTemplate().offered(rows(m)) for m in (1, 4, 16)]
    [True, True, False]
    >>> len(config_space()) <= 30 < 100 <= len(config_space("max"))
    True
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping, Sequence

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import pow2_at_least, unique_configs
from .base import ACC_REGS_MAX, KernelLaunch, TritonTemplate, acc_regs, cdiv, check_size, epilogue_flags, gemm_args

GEMV_MAX_M = 4

def config_space(size: str = "default") -> list[dict[str, int]]:
    """Compile-time configs before fitting: `"default"` (30) or `"max"` (>= 100).

    The default pairs narrow tiles with long K steps (B = W.t(), K contiguous: each row of the
    tile is one coalesced read) and wide tiles with short K steps (B row-major, N contiguous).

    Example:
        >>> sorted({c["BLOCK_N"] for c in config_space()})
        [1, 2, 4, 8, 16, 32, 64, 128, 256]
    """
    check_size(size)
    if size == "default":
        # Few outputs with long K steps (many programs, long contiguous reads of B = W.t(): the shape
        # of Inductor's reduction kernels, which won the M = 1 shapes), medium tiles, and wide tiles
        # with short K steps (B row-major, N contiguous).
        tiles = ((1, 2048), (2, 2048), (4, 1024), (8, 1024), (8, 512), (16, 256), (16, 512), (32, 128),
                 (32, 256), (64, 128), (128, 64), (256, 32))
        # Two outputs per program with few warps led the "max" space on all four M = 1 shapes of the
        # suite on an H200 (docs/ARCHITECTURE.md).
        few_warps = ((2, 2048, 2), (2, 1024, 1), (2, 1024, 4), (2, 4096, 4), (8, 1024, 2), (1, 2048, 2))
        return [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w) for bn, bk in tiles for w in (4, 8)] + [
            dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w) for bn, bk, w in few_warps]
    # The fp32 products of a BLOCK_N x BLOCK_K tile sit in registers: the accumulator limit applies.
    return [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
            for bn, bk, warps in itertools.product((1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                                                   (16, 32, 64, 128, 256, 512, 1024, 2048, 4096), (1, 2, 4, 8))
            if 512 <= bn * bk <= 32768 and acc_regs(bn, bk, warps) <= ACC_REGS_MAX]

def fit_configs(space: Sequence[Mapping[str, int]], N: int, K: int) -> list[dict[str, int]]:
    """Clamp BLOCK_N and BLOCK_K to the problem (BLOCK_K at least 16); drop duplicates.

    Example:
        >>> fit_configs([dict(BLOCK_N=256, BLOCK_K=32, num_warps=8)], 3, 7)
        [{'BLOCK_N': 4, 'BLOCK_K': 16, 'num_warps': 8}]
    """
    cap_n, cap_k = pow2_at_least(N), max(16, pow2_at_least(K))
    return unique_configs(dict(cfg, BLOCK_N=min(cfg["BLOCK_N"], cap_n), BLOCK_K=min(cfg["BLOCK_K"], cap_k))
                          for cfg in space)

class TritonGemvTemplate(TritonTemplate):
    """GEMV-shaped Triton kernel for mm/addmm/bmm with M <= 4 (fp16, bf16, fp32).

    No runtime tuning parameter: the grid is one program per BLOCK_N outputs per row.
    """

    uid = "triton_gemv"
    kernel_file = "gemv_kernel.py"
    config_space = staticmethod(config_space)
    runtime_space: Mapping[str, Sequence[Any]] = {}
    default_runtime: Mapping[str, Any] = {}

    def offered(self, ki: KernelInputs) -> bool:
        """M <= GEMV_MAX_M rows per batch."""
        return ki.M <= GEMV_MAX_M

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        return fit_configs(self.space, ki.N, ki.K)

    traceable = True

    def launch_spec(self, choice: Choice, ki: KernelInputs) -> tuple[KernelLaunch, Callable[..., tuple]]:
        from .gemv_kernel import gemv_kernel

        cfg = choice.config_dict
        meta = dict(BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"], num_stages=1,
                    **epilogue_flags(ki))
        run = KernelLaunch(gemv_kernel, (cdiv(ki.N, cfg["BLOCK_N"]), ki.M, ki.batch), meta)
        return run, lambda tensors, out, swizzle=None: gemm_args(ki, tensors, out)  # no runtime swizzle
