"""Autograd for eager calls whose winner is a generated kernel (Triton, numba, NumPy).

A call that needs a gradient runs the winner inside a `torch.autograd.Function`: forward is the
tuned kernel itself, backward computes the standard GEMM gradients with gemmtune's eager functions
(so gradients are tuned GEMMs too, and differentiable again).  This replaces a hop through the
`torch.library` custom op, which cost 60-70 µs more per call on CPU (bench note in
docs/MODELS.md).  `torch.compile` never comes here: it traces `gemmtune.dispatch.compiled`.

    mm:    dA = dC @ B^T,  dB = A^T @ dC        (bmm: the same per batch)
    addmm: dbias = beta * sum-to-shape(dC),  dA = alpha * dC @ B^T,  dB = alpha * A^T @ dC

Example:
    >>> import torch
    >>> a, b = torch.randn(3, 2, requires_grad=True), torch.randn(2, 4, requires_grad=True)
    >>> y = TunedMM.apply(a, b, torch.mm, torch.mm)
    >>> y.sum().backward(); torch.allclose(a.grad, torch.ones(3, 4) @ b.detach().T)
    True
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["TunedMM", "TunedAddmm"]


def _sum_to(grad: torch.Tensor, shape: tuple) -> torch.Tensor:
    return grad.sum() if len(shape) == 0 else grad.sum_to_size(shape)


class TunedMM(torch.autograd.Function):
    """`kernel(a, b)` with gradients from `grad_mm` (mm or bmm through gemmtune)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, kernel: Callable[..., torch.Tensor],
                grad_mm: Callable[..., torch.Tensor]) -> torch.Tensor:
        ctx.grad_mm = grad_mm
        ctx.save_for_backward(a, b)
        return kernel(a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        ga = ctx.grad_mm(grad, b.mT) if ctx.needs_input_grad[0] else None
        gb = ctx.grad_mm(a.mT, grad) if ctx.needs_input_grad[1] else None
        return ga, gb, None, None


class TunedAddmm(torch.autograd.Function):
    """`kernel(bias, a, b)` = beta * bias + alpha * a @ b, with gradients through `grad_mm`."""

    @staticmethod
    def forward(ctx: Any, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, kernel: Callable[..., torch.Tensor],
                grad_mm: Callable[..., torch.Tensor], alpha: float, beta: float) -> torch.Tensor:
        ctx.grad_mm, ctx.alpha, ctx.beta, ctx.bias_shape = grad_mm, alpha, beta, tuple(bias.shape)
        ctx.save_for_backward(a, b)
        return kernel(bias, a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        gbias = ga = gb = None
        if ctx.needs_input_grad[0]:
            gbias = _sum_to(grad, ctx.bias_shape)
            gbias = gbias * ctx.beta if ctx.beta != 1.0 else gbias
        if ctx.needs_input_grad[1]:
            ga = ctx.grad_mm(grad, b.mT)
            ga = ga * ctx.alpha if ctx.alpha != 1.0 else ga
        if ctx.needs_input_grad[2]:
            gb = ctx.grad_mm(a.mT, grad)
            gb = gb * ctx.alpha if ctx.alpha != 1.0 else gb
        return gbias, ga, gb, None, None, None, None
