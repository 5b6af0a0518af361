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

__all__ = ["TunedMM", "TunedAddmm", "mm_grads", "addmm_grads", "mm_setup", "addmm_setup"]

GradMM = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _sum_to(grad: torch.Tensor, shape: tuple) -> torch.Tensor:
    return grad.sum() if len(shape) == 0 else grad.sum_to_size(shape)


def mm_grads(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, needs: tuple, grad_mm: GradMM) -> tuple:
    """(dA, dB) of C = A @ B (or bmm) for the inputs in `needs`, each GEMM run by `grad_mm`.

    Example:
        >>> a, b, g = torch.randn(3, 2), torch.randn(2, 4), torch.ones(3, 4)
        >>> ga, gb = mm_grads(g, a, b, (True, False), torch.mm); torch.allclose(ga, g @ b.T), gb
        (True, None)
    """
    ga = grad_mm(grad, b.mT) if needs[0] else None
    gb = grad_mm(a.mT, grad) if needs[1] else None
    return ga, gb


def addmm_grads(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, needs: tuple, grad_mm: GradMM,
                bias_shape: tuple, alpha: float, beta: float) -> tuple:
    """(dbias, dA, dB) of beta * bias + alpha * A @ B for the inputs in `needs` (bias, A, B).

    Example:
        >>> g = torch.ones(3, 4)
        >>> gbias, ga, gb = addmm_grads(g, torch.randn(3, 2), torch.randn(2, 4), (True, False, False), torch.mm, (4,), 1.0, 2.0)
        >>> gbias.tolist(), ga, gb
        ([6.0, 6.0, 6.0, 6.0], None, None)
    """
    gbias = None
    if needs[0]:
        gbias = _sum_to(grad, bias_shape)
        gbias = gbias * beta if beta != 1.0 else gbias
    ga, gb = mm_grads(grad, a, b, needs[1:], grad_mm)
    if alpha != 1.0:
        ga = ga * alpha if ga is not None else None
        gb = gb * alpha if gb is not None else None
    return gbias, ga, gb


def mm_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    """`register_autograd`'s setup for the (a, b, backends, out_layout) ops."""
    a, b, backends, _ = inputs
    ctx.backends = backends
    ctx.save_for_backward(a, b)


def addmm_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    """`register_autograd`'s setup for the (bias, a, b, beta, alpha, backends, out_layout) ops."""
    bias, a, b, beta, alpha, backends, _ = inputs
    ctx.backends, ctx.alpha, ctx.beta = backends, alpha, beta
    ctx.bias_shape = tuple(bias.shape)
    ctx.save_for_backward(a, b)


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
        return (*mm_grads(grad, a, b, ctx.needs_input_grad, ctx.grad_mm), None, None)


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
        return (*addmm_grads(grad, a, b, ctx.needs_input_grad, ctx.grad_mm, ctx.bias_shape, ctx.alpha, ctx.beta),
                None, None, None, None)
