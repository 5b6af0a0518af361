"""The `triton_scaled_tma` template: fp8 `torch._scaled_mm` as a persistent GEMM over TMA descriptors.

The persistent TMA counterpart of `triton_scaled_mm` (docs/FP8.md): one program per SM walks the
output tiles, A and the weight W (B = W.t(), the column-major B torch requires) are read and C is
written through device-side tensor descriptors, and the epilogue applies the scales (tensor-wise or
row-wise) and the bias.  For Hopper-class GPUs (compute capability >= 9) and, for tests, the CPU
through Triton's interpreter.  It is a preview template (`Settings(preview_templates=True)`): it joins
the default pool once an H200 run shows it pays.

Compile-time config: BLOCK_M/N/K, num_stages, num_warps (the problem adds its scale kind, bias and
`use_fast_accum`).  Runtime: `swizzle` (GROUP_M), one binary for every swizzle.  TMA needs
16-byte-aligned row strides: K and N multiples of 16, as torch's rules require anyway, and a
row-major output whose rows are 16-byte aligned.

Example:
    >>> from gemmtune.templates.triton.scaled_tma import config_space
    >>> 0 < len(config_space()) < len(config_space("max"))
    True
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import torch

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ...core.validate_fp8 import FP8_DTYPES
from ..base import Launcher
from . import tma
from .base import (ACC_REGS_MAX, DEFAULT_SMEM, TILE_KEYS, KernelLaunch, TritonTemplate, acc_regs, cdiv, check_size,
                   interpreting, pipeline_smem, smem_limit, swizzled_launcher)
from .scaled_mm import MAX_IMPRECISE, scaled_mm_args

def config_space(size: str = "default") -> list[dict[str, int]]:
    """Compile-time configs before fitting: `"default"` or the larger `"max"`.

    Example:
        >>> sorted({c["BLOCK_K"] for c in config_space()}), all(c in config_space("max") for c in config_space())
        ([64, 128], True)
    """
    check_size(size)
    full = size == "max"
    space = []
    for bm, bn, bk, stages, warps in itertools.product(
            (64, 128, 256) if full else (64, 128), (32, 64, 128, 256) if full else (64, 128, 256),
            (32, 64, 128, 256) if full else (64, 128), (2, 3, 4, 5, 6) if full else (3, 4, 5), (4, 8)):
        if acc_regs(bm, bn, warps) > ACC_REGS_MAX or warps == 8 and bm < 128:
            continue  # the accumulator spills; two warpgroups want 128+ rows
        if not full and (warps == 4 and bm * bn > 128 * 128 or warps == 8 and bm * bn < 128 * 128
                         or bk == 128 and bm * bn > 128 * 128):
            continue
        if pipeline_smem(stages, bm, bn, bk, 1) + bm * bn * 2 > DEFAULT_SMEM:
            continue
        space.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps))
    return space


def descriptor_ready(ki: KernelInputs) -> bool:
    """Whether TMA descriptors can describe the operands and the output: a row-major A, the column-major
    B of a row-major weight, 16-byte-aligned row strides (K, and N in the output's dtype).

    Example:
        >>> a = torch.ones(5, 32).to(torch.float8_e4m3fn)
        >>> w = torch.ones(48, 32).to(torch.float8_e4m3fn)
        >>> one = torch.tensor(1.0)
        >>> descriptor_ready(KernelInputs.from_tensors("scaled_mm", a, w.t(), one, one))
        True
    """
    out_bytes = torch.empty((), dtype=ki.result_dtype).element_size()
    return tma.tma_compatible(ki) and tma.b_trans(ki) is True and (ki.N * out_bytes) % 16 == 0


class TritonScaledTMATemplate(TritonTemplate):
    """Persistent TMA-descriptor Triton fp8 scaled_mm (Hopper+): scales and bias in the epilogue.

    `num_sms` overrides the persistent grid size (default: the device's SM count; 4 under the
    interpreter).

    Example:
        >>> TritonScaledTMATemplate.ops, TritonScaledTMATemplate.default_runtime
        (('scaled_mm',), {'swizzle': 8})
    """

    uid = "triton_scaled_tma"
    any_out_stride = False  # its TMA descriptors need 16-byte-aligned output rows
    kernel_file = "scaled_tma_kernel.py"
    config_space = staticmethod(config_space)
    ops = ("scaled_mm",)
    dtypes = FP8_DTYPES

    def __init__(self, space: Sequence[Mapping[str, int]] | None = None, size: str = "default",
                 num_sms: int | None = None):
        super().__init__(space, size)
        self.num_sms = num_sms

    def available(self) -> bool:
        return tma.tensor_descriptors_available()

    def runs_on(self, ki: KernelInputs) -> bool:
        """Compute capability 9 or later (TMA, fp8 wgmma) on CUDA; the CPU through the interpreter."""
        if ki.device_type == "cuda":
            return torch.cuda.is_available() and tma.capability(ki.device)[0] >= 9
        return super().runs_on(ki)

    def offered(self, ki: KernelInputs) -> bool:
        """Where TMA descriptors can describe the operands and the output (`descriptor_ready`)."""
        return descriptor_ready(ki)

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        """The space fitted to the problem (`tma.fit_configs`: one-byte operands, the output tile staged
        in the output's dtype for its store)."""
        out_bytes = torch.empty((), dtype=ki.result_dtype).element_size()
        return tma.fit_configs(self.space, ki.M, ki.N, ki.K, 1, smem_limit(ki.device), ki.bias is not None,
                               out_bytes=out_bytes)

    def sms(self, ki: KernelInputs) -> int:
        """Programs of a full persistent grid: the device's SMs (constexpr NUM_SMS: one binary per device)."""
        return self.num_sms or (4 if ki.device_type == "cpu" else tma.sm_count(ki.device))

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        from .scaled_tma_kernel import scaled_tma_kernel

        if not descriptor_ready(ki):
            raise ValueError(f"triton_scaled_tma: {ki.describe()} has strides TMA cannot describe")
        cfg, sms = choice.config_dict, self.sms(ki)
        grid = (max(1, min(sms, cdiv(ki.M, cfg["BLOCK_M"]) * cdiv(ki.N, cfg["BLOCK_N"]))), 1, 1)
        run = KernelLaunch(scaled_tma_kernel, grid, dict(
            {k: cfg[k] for k in TILE_KEYS}, NUM_SMS=sms, ROWWISE=ki.scales == "rowwise", HAS_BIAS=ki.bias is not None,
            FAST_ACCUM=ki.fast_accum, MAX_IMPRECISE=min(cfg["BLOCK_K"], MAX_IMPRECISE)))
        interp = interpreting()
        stride_am = tma.row_stride(ki.a.stride, ki.a.size, "row", 1)  # a single row's: the dense one
        stride_wn = tma.row_stride(ki.b.stride, ki.b.size, "col", 1)

        def args(tensors, out, swizzle):
            if not out.is_contiguous():
                raise ValueError(f"triton_scaled_tma: output must be row-major [M, N], got strides {out.stride()}")
            tma.check_aligned(self.uid, tensors[0], tensors[1], out)
            if not interp:
                tma.ensure_allocator()  # the launch takes the descriptors' scratch from it
            full = scaled_mm_args(ki, tensors, out, swizzle)  # (..., sizes, the 6 strides, bias step, swizzle)
            return (*full[:9], stride_am, stride_wn, ki.N, *full[-2:])

        return swizzled_launcher(ki, example, run, args, before=None if interp else tma.ensure_allocator)
