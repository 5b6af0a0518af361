"""The `triton_gemv` template: matrix-vector style kernels for M <= 4 (decode-time GEMV).

With one to four rows in A, an mm is bound by reading B once; a tensor-core tile of 16+ rows wastes
most of its work and cuBLAS's GEMV path leaves bandwidth unused on the H200 (Inductor's fused
reduction ran 11-27% faster than cuBLAS on the suite's M = 1 shapes, docs/PERFORMANCE.md).  Each
program computes BLOCK_N outputs of one row (and batch), streaming B in BLOCK_N x BLOCK_K tiles.

Compile-time config: BLOCK_N, BLOCK_K, num_warps.  Runtime: M, N, K and every stride (no runtime
tuning parameter: the grid is one program per BLOCK_N outputs per row).  mm / addmm / bmm, fp16,
bf16, fp32 (fp32 products, never tf32), any strides.

On an H200 its narrow long-K configs beat cuBLAS on three of the suite's four M = 1 shapes
(bench/skinny_probe.py, docs/HOPPER_TEMPLATES.md), so it is in the default pool (Hopper set).

Example:
    >>> import torch
    >>> from gemmtune.core.inputs import KernelInputs
    >>> t = TritonGemvTemplate()
    >>> t.offered(KernelInputs.from_tensors("mm", torch.ones(1, 64), torch.ones(64, 8)))
    True
    >>> t.offered(KernelInputs.from_tensors("mm", torch.ones(16, 64), torch.ones(64, 8)))
    False
    >>> len(config_space()) <= 30 < 100 <= len(config_space("max"))
    True
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import Launcher, Template, split_operands
from .launch import FastLaunch
from .mm import SPACE_SIZES, _bstrides, _pow2_at_least, interpreting, triton_available, triton_cdiv

KERNEL_FILE = Path(__file__).with_name("gemv_kernel.py")
GEMV_MAX_M = 4
_ELEMS_PER_THREAD_MAX = 128  # fp32 accumulator elements per thread (registers)


def config_space(size: str = "default") -> list[dict[str, int]]:
    """Compile-time configs before fitting: `"default"` (30) or `"max"` (>= 100).

    The default pairs narrow tiles with long K steps (B = W.t(), K contiguous: each row of the
    tile is one coalesced read) and wide tiles with short K steps (B row-major, N contiguous).

    Example:
        >>> sorted({c["BLOCK_N"] for c in config_space()})
        [1, 2, 4, 8, 16, 32, 64, 128, 256]
    """
    if size not in SPACE_SIZES:
        raise ValueError(f"config_space: unknown size {size!r}; expected one of {', '.join(SPACE_SIZES)}")
    if size == "default":
        # Few outputs with long K steps (many programs, long contiguous reads of B = W.t(): the shape
        # of Inductor's reduction kernels, which won the M = 1 shapes), medium tiles, and wide tiles
        # with short K steps (B row-major, N contiguous).
        tiles = ((1, 2048), (2, 2048), (4, 1024), (8, 1024), (8, 512), (16, 256), (16, 512), (32, 128),
                 (32, 256), (64, 128), (128, 64), (256, 32))
        # Two outputs per program with few warps led the "max" space on all four M = 1 shapes of the
        # suite on an H200 (bench/skinny_probe.py --space max --templates gemv, docs/PERFORMANCE.md).
        few_warps = ((2, 2048, 2), (2, 1024, 1), (2, 1024, 4), (2, 4096, 4), (8, 1024, 2), (1, 2048, 2))
        return [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w) for bn, bk in tiles for w in (4, 8)] + [
            dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w) for bn, bk, w in few_warps]
    space = []
    for bn in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        for bk in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096):
            for warps in (1, 2, 4, 8):
                elems = bn * bk
                if not 512 <= elems <= 32768 or elems // (32 * warps) > _ELEMS_PER_THREAD_MAX:
                    continue
                space.append(dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps))
    return space


def fit_configs(space: Sequence[Mapping[str, int]], N: int, K: int) -> list[dict[str, int]]:
    """Clamp BLOCK_N and BLOCK_K to the problem (BLOCK_K at least 16); drop duplicates.

    Example:
        >>> fit_configs([dict(BLOCK_N=256, BLOCK_K=32, num_warps=8)], 3, 7)
        [{'BLOCK_N': 4, 'BLOCK_K': 16, 'num_warps': 8}]
    """
    seen, out = set(), []
    cap_n, cap_k = _pow2_at_least(N), max(16, _pow2_at_least(K))
    for cfg in space:
        c = dict(cfg, BLOCK_N=min(cfg["BLOCK_N"], cap_n), BLOCK_K=min(cfg["BLOCK_K"], cap_k))
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


class TritonGemvTemplate(Template):
    """GEMV-shaped Triton kernel for mm/addmm/bmm with M <= 4 (fp16, bf16, fp32)."""

    uid = "triton_gemv"
    family = "triton"
    src_hash = hashlib.sha256(KERNEL_FILE.read_bytes()).hexdigest()
    native_devices = ("cuda",)

    def __init__(self, space: Sequence[Mapping[str, int]] | None = None, size: str = "default"):
        self.space = list(space) if space is not None else config_space(size)

    def offered(self, ki: KernelInputs) -> bool:
        """M <= GEMV_MAX_M rows per batch."""
        return ki.M <= GEMV_MAX_M

    def supports(self, ki: KernelInputs) -> bool:
        if not triton_available() or ki.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return False
        if ki.device_type != "cuda" and not (ki.device_type == "cpu" and interpreting()):
            return False
        if max(ki.M * ki.K, ki.K * ki.N, ki.M * ki.N) >= 2**31:
            return False
        return self.offered(ki)

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        return fit_configs(self.space, ki.N, ki.K)

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        from .gemv_kernel import gemv_kernel

        cfg = choice.config_dict
        M, N, K, batch, alpha, beta = ki.M, ki.N, ki.K, ki.batch, ki.alpha, ki.beta
        meta = dict(BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"], num_stages=1,
                    HAS_BIAS=ki.op == "addmm" and beta != 0.0, SCALED=ki.op == "addmm" and alpha != 1.0)
        grid = (triton_cdiv(N, cfg["BLOCK_N"]), M, batch)

        def args(tensors, out):
            bias, a, b = split_operands(ki, tensors)
            if bias is not None:
                sbias = bias.expand(M, N).stride()
            else:
                bias, sbias = out, (0, 0)
            return (a, b, out, bias, M, N, K, *_bstrides(a), *_bstrides(b), *_bstrides(out), *sbias, alpha, beta)

        fast: FastLaunch | None = None

        def launch(tensors, out=None):
            if out is None:
                out = torch.empty(ki.out_size, dtype=ki.dtype, device=tensors[-1].device)
            a = args(tensors, out)
            if fast is None or not fast(a):
                gemv_kernel[grid](*a, **meta)
            return out

        if not interpreting():  # compile now, so errors and resource overflows surface at compile time
            device = example[-1].device
            out = torch.empty(ki.out_size, dtype=ki.dtype, device=device)
            with torch.cuda.device(device):
                a = args(example, out)
                compiled = gemv_kernel.warmup(*a, grid=grid, **meta)
                init = getattr(compiled, "_init_handles", None)
                if init is not None:
                    init()
                fast = FastLaunch.build(gemv_kernel, compiled, grid, meta, a)
        return launch
