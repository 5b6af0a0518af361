"""The `triton_skinny` template: one-launch split-K GEMM for few rows (decode-time `nn.Linear`).

With M <= 256 an mm reads B (the weight) once and does little arithmetic on it: it is bound by
DRAM bandwidth, and the only way to reach that bandwidth is enough loads in flight on every SM.
A plain GEMM has too few output tiles for that (N / BLOCK_N programs), a two-pass split-K
(`triton_splitk`) pays a second launch and a round trip of the partials through memory.  This
template splits K too, but finishes in the same launch: the last of a tile's SPLIT_K programs to
arrive (an acq_rel counter per tile) sums the fp32 partials in slice order, writes the tile and
resets the counter, so results are deterministic and the kernel is one launch (CUDA-graph safe).

Compile-time config: BLOCK_M/N/K, SPLIT_K (1 = no split), num_stages, num_warps.  Runtime:
`swizzle` (GROUP_M), M, N, K, every stride.  mm / addmm / bmm, fp16, bf16, fp32 (tf32 following
torch's setting), any strides.  The workspace and counters are kept per CUDA stream (launches on
one stream are ordered, so they can share them); during CUDA-graph capture each launch gets its
own, owned by the graph.

Example:
    >>> import torch
    >>> from gemmtune.core.inputs import KernelInputs
    >>> t = TritonSkinnyTemplate()
    >>> t.offered(KernelInputs.from_tensors("mm", torch.ones(16, 64), torch.ones(64, 8)))
    True
    >>> t.offered(KernelInputs.from_tensors("mm", torch.ones(512, 64), torch.ones(64, 8)))
    False
    >>> len(config_space()) <= 64 < 100 <= len(config_space("max"))
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
from .mm import (SPACE_SIZES, STAGE1_SWIZZLE, SWIZZLES, _bstrides, _input_precision, _pow2_at_least,
                        _smem_limit, interpreting, triton_available, triton_cdiv)

KERNEL_FILE = Path(__file__).with_name("skinny_kernel.py")
SKINNY_MAX_M = 256
WORKSPACE_LIMIT = 256 * 2**20  # bytes of fp32 partials per stream; larger splits are dropped
_ACC_REGS_MAX = 128  # fp32 accumulator elements per thread


def config_space(size: str = "default") -> list[dict[str, int]]:
    """Compile-time configs before fitting: `"default"` (64) or `"max"` (several hundred).

    Example:
        >>> sorted({c["SPLIT_K"] for c in config_space()})
        [1, 2, 4, 8]
    """
    if size not in SPACE_SIZES:
        raise ValueError(f"config_space: unknown size {size!r}; expected one of {', '.join(SPACE_SIZES)}")
    if size == "default":
        tiles = ((16, 32), (16, 64), (16, 128), (32, 64), (64, 64), (64, 128), (128, 64), (128, 128))
        return [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=stages,
                     num_warps=8 if bm * bn >= 128 * 128 else 4)
                for bm, bn in tiles for bk, stages in ((128, 4), (256, 3)) for split in (1, 2, 4, 8)]
    space = []
    for bm in (16, 32, 64, 128):
        for bn in (32, 64, 128, 256):
            for bk in (64, 128, 256):
                for stages in (3, 4, 5):
                    for warps in (4, 8):
                        if bm * bn // (32 * warps) > _ACC_REGS_MAX or warps == 8 and bm * bn < 64 * 128:
                            continue
                        if stages * (bm + bn) * bk * 2 > 232_448:
                            continue
                        for split in (1, 2, 4, 8, 16):
                            space.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                                              num_stages=stages, num_warps=warps))
    return space


def fit_configs(space: Sequence[Mapping[str, int]], M: int, N: int, K: int, elt_bytes: int, smem_limit: int,
                batch: int = 1) -> list[dict[str, int]]:
    """Clamp tiles to the problem (min 16); drop duplicates, configs over shared memory, splits with
    fewer K steps than slices, and workspaces over `WORKSPACE_LIMIT`.

    Example:
        >>> cfg = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=128, SPLIT_K=8, num_stages=4, num_warps=4)
        >>> fit_configs([cfg], 1, 4096, 4096, 2, 232448)[0]["BLOCK_M"]
        16
        >>> fit_configs([cfg], 1, 4096, 512, 2, 232448)   # 4 K steps cannot feed 8 slices
        []
    """
    seen, out = set(), []
    cap_m, cap_n, cap_k = (max(16, _pow2_at_least(d)) for d in (M, N, K))
    for cfg in space:
        c = dict(cfg, BLOCK_M=min(cfg["BLOCK_M"], cap_m), BLOCK_N=min(cfg["BLOCK_N"], cap_n),
                 BLOCK_K=min(cfg["BLOCK_K"], cap_k))
        if c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * elt_bytes > smem_limit:
            continue
        if c["BLOCK_M"] * c["BLOCK_N"] < 32 * 32 * 2 and c["num_warps"] > 4:
            continue
        tiles = batch * triton_cdiv(M, c["BLOCK_M"]) * triton_cdiv(N, c["BLOCK_N"])
        if triton_cdiv(K, c["BLOCK_K"]) < c["SPLIT_K"]:
            continue
        if c["SPLIT_K"] > 1 and tiles * c["SPLIT_K"] * c["BLOCK_M"] * c["BLOCK_N"] * 4 > WORKSPACE_LIMIT:
            continue
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _raw_stream(index: int) -> int:
    """The current CUDA stream's handle on device `index` (Triton's driver call: no Stream object)."""
    try:
        from triton.runtime import driver

        return driver.active.get_current_stream(index)
    except Exception:  # noqa: BLE001 - another Triton version
        return torch.cuda.current_stream(index).cuda_stream


class _Buffers:
    """Workspace and arrival counters of one binary, kept per CUDA stream."""

    def __init__(self, ws_elems: int, tiles: int):
        self.ws_elems, self.tiles = max(1, ws_elems), max(1, tiles)
        self._by_stream: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}

    def _new(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty(self.ws_elems, dtype=torch.float32, device=device),
                torch.zeros(self.tiles, dtype=torch.int32, device=device))

    def get(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device.type != "cuda":
            key: Any = device.type
        elif torch.cuda.is_current_stream_capturing():
            return self._new(device)  # the graph owns them; counters reset inside every replay
        else:
            key = (device.index, _raw_stream(device.index))
        bufs = self._by_stream.get(key)
        if bufs is None:
            bufs = self._by_stream[key] = self._new(device)
        return bufs


class TritonSkinnyTemplate(Template):
    """One-launch split-K Triton mm/addmm/bmm for M <= 256 (fp16, bf16, fp32)."""

    uid = "triton_skinny"
    family = "triton"
    src_hash = hashlib.sha256(KERNEL_FILE.read_bytes()).hexdigest()
    runtime_space = {"swizzle": SWIZZLES}
    default_runtime = {"swizzle": STAGE1_SWIZZLE}
    native_devices = ("cuda",)

    def __init__(self, space: Sequence[Mapping[str, int]] | None = None, size: str = "default"):
        self.space = list(space) if space is not None else config_space(size)

    def offered(self, ki: KernelInputs) -> bool:
        """M <= SKINNY_MAX_M rows per batch."""
        return ki.M <= SKINNY_MAX_M

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

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        from .skinny_kernel import skinny_kernel

        cfg = choice.config_dict
        bm, bn, bk, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
        M, N, K, batch, alpha, beta = ki.M, ki.N, ki.K, ki.batch, ki.alpha, ki.beta
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=cfg["num_stages"],
                    num_warps=cfg["num_warps"], HAS_BIAS=ki.op == "addmm" and beta != 0.0,
                    SCALED=ki.op == "addmm" and alpha != 1.0, INPUT_PRECISION=_input_precision(ki.dtype))
        tiles = triton_cdiv(M, bm) * triton_cdiv(N, bn)
        grid = (tiles, split, batch)
        buffers = _Buffers(batch * tiles * split * bm * bn if split > 1 else 1, batch * tiles)

        def args(tensors, out, swizzle, bufs):
            bias, a, b = split_operands(ki, tensors)
            if bias is not None:
                sbias = bias.expand(M, N).stride()
            else:
                bias, sbias = out, (0, 0)
            ws, counters = bufs
            return (a, b, out, bias, ws, counters, M, N, K, *_bstrides(a), *_bstrides(b), *_bstrides(out), *sbias,
                    alpha, beta, swizzle)

        fast: FastLaunch | None = None

        def launch(tensors, out=None, swizzle=STAGE1_SWIZZLE):
            device = tensors[-1].device
            if out is None:
                out = torch.empty(ki.out_size, dtype=ki.dtype, device=device)
            a = args(tensors, out, swizzle, buffers.get(device))
            if fast is None or not fast(a):
                skinny_kernel[grid](*a, **meta)
            return out

        if not interpreting():  # compile now, so errors and resource overflows surface at compile time
            device = example[-1].device
            out = torch.empty(ki.out_size, dtype=ki.dtype, device=device)
            with torch.cuda.device(device):
                a = args(example, out, STAGE1_SWIZZLE, buffers.get(device))
                compiled = skinny_kernel.warmup(*a, grid=grid, **meta)
                init = getattr(compiled, "_init_handles", None)
                if init is not None:
                    init()
                fast = FastLaunch.build(skinny_kernel, compiled, grid, meta, a)
        return launch
