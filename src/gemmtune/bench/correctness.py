"""The correctness gate: a candidate must match a higher-precision reference."""

from __future__ import annotations

from typing import Sequence

import torch

from ..core.inputs import KernelInputs
from ..templates.base import split_operands

# Relative Frobenius-norm error allowed per input dtype (docs/ARCHITECTURE.md, "Correctness gate"):
# correct kernels measured fp32 far under 1e-3, tf32 near 3e-4, bf16 operands 1e-3 to 1e-2.
_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
_TF32_TOL = 5e-3


def tolerance(ki: KernelInputs) -> float:
    """The relative error `check` allows for `ki`'s dtype (and TF32 where it is on).

    Example:
        >>> tolerance(KernelInputs.from_tensors("mm", torch.randn(2, 2), torch.randn(2, 2)))
        0.0001
    """
    if ki.dtype == torch.float32 and ki.device_type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return _TF32_TOL
    return _TOL[ki.dtype]


def reference(ki: KernelInputs, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The op computed in float64 on the inputs' device.

    Example:
        >>> a, b = torch.randn(3, 2), torch.randn(2, 4)
        >>> reference(KernelInputs.from_tensors("mm", a, b), (a, b)).dtype
        torch.float64
    """
    bias, a, b = split_operands(ki, tensors)
    out = torch.matmul(a.double(), b.double())
    if bias is not None:
        out = ki.alpha * out
        if ki.beta != 0.0:
            out = out + ki.beta * bias.double()
    return out


def check(ki: KernelInputs, out: torch.Tensor, ref: torch.Tensor) -> str | None:
    """None when `out` matches `ref`; otherwise a short reason.

    Example:
        >>> a, b = torch.randn(3, 2), torch.randn(2, 4)
        >>> ki = KernelInputs.from_tensors("mm", a, b)
        >>> check(ki, a @ b, reference(ki, (a, b))), check(ki, torch.full((3, 4), float("nan")), reference(ki, (a, b)))
        (None, '12 elements NaN or unwritten')
    """
    if tuple(out.shape) != tuple(ref.shape):
        return f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o = out.double()
    bad = torch.isnan(o) & ~torch.isnan(ref)
    if bool(bad.any()):
        return f"{int(bad.sum())} elements NaN or unwritten"
    # Overflow of the output dtype is data: where the reference rounded to that dtype is
    # infinite the candidate must give the same infinity; elsewhere it is compared in float64.
    rounded = ref.to(out.dtype).double() if out.dtype != torch.float64 else ref
    overflow = torch.isinf(rounded) & torch.isfinite(ref)
    if bool(overflow.any()):
        if not bool((o[overflow] == rounded[overflow]).all()):
            return "elements that overflow the output dtype differ from the rounded reference"
        ref = torch.where(overflow, torch.nan, ref)
    finite = torch.isfinite(ref)
    diff = (o - ref)[finite]
    scale = float(torch.linalg.vector_norm(ref[finite])) or 1.0
    rel = float(torch.linalg.vector_norm(diff)) / scale
    tol = tolerance(ki)
    if rel > tol:
        return f"relative error {rel:.2e} > {tol:.0e}"
    # A few grossly wrong elements can hide in a norm: bound the worst one too.
    if diff.numel():
        worst, peak = float(diff.abs().max()), float(ref[finite].abs().max())
        if worst > 10 * tol * max(peak, 1e-30):
            return f"max abs error {worst:.3g} > {10 * tol:.0e} x max |ref| {peak:.3g}"
    return None
