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

import itertools
from typing import Any, Mapping, Sequence

import torch

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import Launcher
from ..staging import current_stream_handle
from .base import (ACC_REGS_MAX, DEFAULT_SMEM, TILE_KEYS, KernelLaunch, TritonTemplate, acc_regs, cdiv, check_size,
                   epilogue_flags, fit_tiles, gemm_args, input_precision, pipeline_smem, smem_limit, swizzled_launcher)

SKINNY_MAX_M = 256
WORKSPACE_LIMIT = 256 * 2**20  # bytes of fp32 partials per stream; larger splits are dropped


def config_space(size: str = "default") -> list[dict[str, int]]:
    """Compile-time configs before fitting: `"default"` (64) or `"max"` (several hundred).

    Example:
        >>> sorted({c["SPLIT_K"] for c in config_space()})
        [1, 2, 4, 8]
    """
    check_size(size)
    if size == "default":
        tiles = ((16, 32), (16, 64), (16, 128), (32, 64), (64, 64), (64, 128), (128, 64), (128, 128))
        return [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=stages,
                     num_warps=8 if bm * bn >= 128 * 128 else 4)
                for bm, bn in tiles for bk, stages in ((128, 4), (256, 3)) for split in (1, 2, 4, 8)]
    space = []
    for bm, bn, bk, stages, warps in itertools.product((16, 32, 64, 128), (32, 64, 128, 256), (64, 128, 256),
                                                       (3, 4, 5), (4, 8)):
        if acc_regs(bm, bn, warps) > ACC_REGS_MAX or warps == 8 and bm * bn < 64 * 128:
            continue
        if pipeline_smem(stages, bm, bn, bk) > DEFAULT_SMEM:
            continue
        space += [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=stages, num_warps=warps)
                  for split in (1, 2, 4, 8, 16)]
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
    def fits(c: Mapping[str, int]) -> bool:
        tiles = batch * cdiv(M, c["BLOCK_M"]) * cdiv(N, c["BLOCK_N"])
        workspace = tiles * c["SPLIT_K"] * c["BLOCK_M"] * c["BLOCK_N"] * 4
        return cdiv(K, c["BLOCK_K"]) >= c["SPLIT_K"] and (c["SPLIT_K"] == 1 or workspace <= WORKSPACE_LIMIT)

    return [c for c in fit_tiles(space, M, N, K, elt_bytes, smem_limit) if fits(c)]


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
            key = (device.index, current_stream_handle(device.index))
        bufs = self._by_stream.get(key)
        if bufs is None:
            bufs = self._by_stream[key] = self._new(device)
        return bufs


class TritonSkinnyTemplate(TritonTemplate):
    """One-launch split-K Triton mm/addmm/bmm for M <= 256 (fp16, bf16, fp32)."""

    uid = "triton_skinny"
    kernel_file = "skinny_kernel.py"
    config_space = staticmethod(config_space)

    def offered(self, ki: KernelInputs) -> bool:
        """M <= SKINNY_MAX_M rows per batch."""
        return ki.M <= SKINNY_MAX_M

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        return fit_configs(self.space, ki.M, ki.N, ki.K, ki.dtype.itemsize, smem_limit(ki.device), ki.batch)

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        from .skinny_kernel import skinny_kernel

        cfg = choice.config_dict
        bm, bn, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SPLIT_K"]
        tiles = cdiv(ki.M, bm) * cdiv(ki.N, bn)
        run = KernelLaunch(skinny_kernel, (tiles, split, ki.batch),
                           dict({k: cfg[k] for k in TILE_KEYS}, SPLIT_K=split, **epilogue_flags(ki),
                                INPUT_PRECISION=input_precision(ki.dtype)))
        buffers = _Buffers(ki.batch * tiles * split * bm * bn if split > 1 else 1, ki.batch * tiles)

        def args(tensors, out, swizzle):
            return (*gemm_args(ki, tensors, out), *buffers.get(tensors[-1].device), swizzle)

        return swizzled_launcher(ki, example, run, args, buffers=buffers.get)
