"""The correctness gate: a candidate must match a higher-precision reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..core.inputs import KernelInputs
from ..templates.base import split_operands

# Relative Frobenius-norm error allowed per input dtype (docs/ARCHITECTURE.md, "Correctness gate"):
# correct kernels measured fp32 far under 1e-3, tf32 near 3e-4, bf16 operands 1e-3 to 1e-2.
_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
_TF32_TOL = 5e-3
# scaled_mm: dequantised fp8 operands are exact in float64, so a correct kernel's error is its output's
# rounding (the output dtype's tolerance above) plus its accumulation's.  Hopper's fp8 tensor cores keep
# about 14 bits in their partial sums even without fast accumulation: with a float32 output cuBLASLt
# (torch._scaled_mm) reads 1.22-1.28e-4 relative error, over float32's 1e-4, and the wgmma Triton
# configs 4.5e-5-1.28e-4 (H200, 2026-12-01).  So an exact problem adds 2.5e-4
# (about 2**-12), and one with `use_fast_accum=True`, where fewer bits are kept, up to 2e-2.  docs/FP8.md.
_EXACT_ACCUM_TOL = 2.5e-4
_FAST_ACCUM_TOL = 2e-2


def tolerance(ki: KernelInputs) -> float:
    """The relative error `check` allows for `ki`'s dtype (and TF32 where it is on).

    Example:
        >>> tolerance(KernelInputs.from_tensors("mm", torch.randn(2, 2), torch.randn(2, 2)))
        0.0001
    """
    if ki.op == "scaled_mm":
        return _TOL[ki.result_dtype] + (_FAST_ACCUM_TOL if ki.fast_accum else _EXACT_ACCUM_TOL)
    if ki.dtype == torch.float32 and ki.device_type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return _TF32_TOL
    return _TOL[ki.dtype]


def reference(ki: KernelInputs, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The op computed in float64 on the inputs' device, with torch.addmm's semantics for the scalars:
    alpha == 0 does not compute A @ B (NaN and Inf in A or B do not reach the output), beta == 0
    ignores the bias (NaN and Inf in it neither).

    Example:
        >>> a, b = torch.randn(3, 2), torch.randn(2, 4)
        >>> reference(KernelInputs.from_tensors("mm", a, b), (a, b)).dtype
        torch.float64
        >>> a[0, 0] = float("nan")
        >>> bias = torch.ones(4)
        >>> reference(KernelInputs.from_tensors("addmm", bias, a, b, alpha=0.0), (bias, a, b)).isnan().any().item()
        False
    """
    if ki.op == "scaled_mm":
        return scaled_reference(tensors)
    bias, a, b = split_operands(ki, tensors)
    if bias is None:
        return torch.matmul(a.double(), b.double())
    if ki.alpha != 0.0:
        out = ki.alpha * torch.matmul(a.double(), b.double())
    else:
        out = torch.zeros(ki.out_size, dtype=torch.float64, device=a.device)
    if ki.beta != 0.0:
        out = out + ki.beta * bias.double()
    return out


def scaled_reference(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """scaled_mm in float64: the product of the dequantised operands, `(a * scale_a) @ (b * scale_b)`
    (+ bias); a row-wise `scale_a` [M, 1] scales a's rows, `scale_b` [1, N] b's columns.

    Example:
        >>> a = torch.full((2, 16), 2.0).to(torch.float8_e4m3fn)
        >>> b = torch.ones(3, 16).to(torch.float8_e4m3fn).t()
        >>> scaled_reference((a, b, torch.tensor(0.5), torch.tensor(3.0)))[0].tolist()
        [48.0, 48.0, 48.0]
    """
    a, b, scale_a, scale_b = tensors[:4]
    out = torch.matmul(a.double() * scale_a.double(), b.double() * scale_b.double())
    return out + tensors[4].double() if len(tensors) > 4 else out


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
    # NaN and Inf in the operands are data: the output has them exactly where the reference has them.
    lost = torch.isnan(ref) & ~torch.isnan(o)
    if bool(lost.any()):
        return f"{int(lost.sum())} elements not NaN where the reference is NaN"
    inf = torch.isinf(ref)
    if bool(inf.any()) and not bool((o[inf] == ref[inf]).all()):
        return "elements that are infinite in the reference differ from it"
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


@dataclass(frozen=True)
class Reference:
    """A problem's float64 reference and what every candidate's check reuses, computed once per problem.

    `rounded`: the reference rounded to the output dtype, where every element is finite and stays
    finite in that dtype (else None: every check takes `check`'s full path); `scale` and `peak`: its
    Frobenius norm and largest magnitude.
    """

    exact: torch.Tensor
    rounded: torch.Tensor | None
    scale: float
    peak: float

    @classmethod
    def of(cls, ki: KernelInputs, tensors: Sequence[torch.Tensor]) -> "Reference":
        """The reference of `ki` on `tensors` (see `reference`).

        Example:
            >>> a, b = torch.randn(3, 2), torch.randn(2, 4)
            >>> Reference.of(KernelInputs.from_tensors("mm", a, b), (a, b)).rounded.dtype
            torch.float32
        """
        exact = reference(ki, tensors)
        rounded = exact.to(ki.result_dtype)
        fast = bool(torch.isfinite(rounded).all())
        scale = float(torch.linalg.vector_norm(exact)) if fast else 0.0
        peak = float(exact.abs().max()) if fast and exact.numel() else 0.0
        return cls(exact, rounded if fast else None, scale or 1.0, peak)


def verdict(ki: KernelInputs, out: torch.Tensor, ref: Reference) -> str | None:
    """`check`'s verdict on `out`, cheaper: a clear pass is decided in the output's dtype, anything else
    (a NaN, an error above half the tolerance or half the worst-element bound) by `check` itself.

    Sound: the rounded reference differs from the exact one by at most the dtype's unit roundoff per
    element (6e-8 in float32, 4e-3 in bfloat16), well under half of every tolerance, so what passes
    here passes `check`.  The full path's float64 copy, masks and indexing are paid only by the
    candidates that are wrong or borderline.

    Example:
        >>> a, b = torch.randn(30, 20), torch.randn(20, 40)
        >>> ki = KernelInputs.from_tensors("mm", a, b)
        >>> ref = Reference.of(ki, (a, b))
        >>> wrong = a @ b
        >>> wrong[29, 39] += 1.0  # one bad element in the last tile
        >>> verdict(ki, a @ b, ref), verdict(ki, wrong, ref) == check(ki, wrong, ref.exact) is not None
        (None, True)
    """
    r = ref.rounded
    if r is not None and out.dtype == r.dtype and out.shape == r.shape and not bool(torch.isnan(out).any()):
        diff = out - r
        tol = tolerance(ki)
        rel = float(torch.linalg.vector_norm(diff)) / ref.scale
        worst = float(diff.abs().max()) if diff.numel() else 0.0
        if rel <= tol / 2 and worst <= 5 * tol * max(ref.peak, 1e-30):
            return None
    return check(ki, out, ref.exact)
