"""Autograd and torch.func for eager calls whose winner is a generated kernel (Triton, numba, NumPy).

A call that needs a gradient runs the winner inside a `torch.autograd.Function`: forward is the
tuned kernel itself, backward computes the standard GEMM gradients with gemmtune's eager functions
(so gradients are tuned GEMMs too, and differentiable again).  The Functions define `setup_context`,
`jvp` and a batching rule (`vmap`), so `torch.func.grad`, `jacrev`, `jacfwd` and `vmap` work on them:
under a transform the eager ops call them with a kernel that dispatches again one level down, where
the operands are plain tensors; the batching rule runs a vmapped mm as one tuned mm or bmm of the
physical (batched) operands.  This replaces a hop through the
`torch.library` custom op, which cost 60-70 µs more per call on CPU (bench note in
docs/MODELS.md).  `torch.compile` never comes here: it traces `gemmtune.dispatch.compiled`.

    mm:    dA = dC @ B^T,  dB = A^T @ dC        (bmm: the same per batch)
    addmm: dbias = beta * sum-to-shape(dC),  dA = alpha * dC @ B^T,  dB = alpha * A^T @ dC

Example:
    >>> import torch
    >>> a, b = torch.randn(3, 2, requires_grad=True), torch.randn(2, 4, requires_grad=True)
    >>> y = TunedMM.apply(a, b, torch.mm, Gemms(torch.mm, torch.bmm))
    >>> y.sum().backward(); torch.allclose(a.grad, torch.ones(3, 4) @ b.detach().T)
    True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["Gemms", "gemms_for", "redispatch", "transform_runner", "TunedMM", "TunedAddmm", "mm_grads", "addmm_grads", "mm_setup", "addmm_setup", "batched_product"]

GradMM = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Gemms:
    """The tuned GEMMs a Function's backward, jvp and batching rule call: gemmtune's eager `mm` and
    `bmm` for one `backends`; `batched`: the Function computes a bmm (its gradients are bmms)."""

    mm: GradMM
    bmm: GradMM
    batched: bool = False

    @property
    def own(self) -> GradMM:
        """The op the Function computes (its gradients' GEMMs): bmm when batched, else mm."""
        return self.bmm if self.batched else self.mm


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


def batched_product(a: torch.Tensor, b: torch.Tensor, a_dim: int | None, b_dim: int | None, size: int,
                    gemms: Gemms) -> torch.Tensor:
    """The physical result of a vmap over `a @ b` (mm, or bmm when `gemms.batched`), vmapped dim first.

    mm with only A batched runs as one mm of the stacked rows; otherwise the vmapped dim is moved
    first (an unbatched operand expanded) and the lot runs as one bmm (bmm: vmapped and batch dims
    flattened into one).

    Example:
        >>> a, b = torch.randn(3, 4, 2), torch.randn(2, 5)
        >>> torch.allclose(batched_product(a, b, 0, None, 3, Gemms(torch.mm, torch.bmm)), a @ b)
        True
    """
    if not gemms.batched and b_dim is None:
        a = a.movedim(a_dim, 0) if a_dim is not None else a.expand(size, *a.shape)
        return gemms.mm(a.reshape(-1, a.shape[-1]), b).reshape(size, a.shape[1], b.shape[-1])
    a = a.movedim(a_dim, 0) if a_dim is not None else a.expand(size, *a.shape)
    b = b.movedim(b_dim, 0) if b_dim is not None else b.expand(size, *b.shape)
    if not gemms.batched:
        return gemms.bmm(a, b)
    out = gemms.bmm(a.reshape(-1, *a.shape[2:]), b.reshape(-1, *b.shape[2:]))
    return out.reshape(size, a.shape[1], *out.shape[1:])


class TunedMM(torch.autograd.Function):
    """`kernel(a, b)` (mm, or bmm when `gemms.batched`) with gradients, jvp and vmap through `gemms`."""

    @staticmethod
    def forward(a: torch.Tensor, b: torch.Tensor, kernel: Callable[..., torch.Tensor], gemms: Gemms) -> torch.Tensor:
        return kernel(a, b)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        a, b, _, gemms = inputs
        ctx.gemms = gemms
        ctx.save_for_backward(a, b)
        ctx.save_for_forward(a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        return (*mm_grads(grad, a, b, ctx.needs_input_grad, ctx.gemms.own), None, None)

    @staticmethod
    def jvp(ctx: Any, da: torch.Tensor | None, db: torch.Tensor | None, *_: Any) -> torch.Tensor:
        a, b = ctx.saved_tensors
        return _product_tangent(a, b, da, db, ctx.gemms.own)

    @staticmethod
    def vmap(info: Any, in_dims: tuple, a: torch.Tensor, b: torch.Tensor, kernel: Any, gemms: Gemms) -> tuple:
        return batched_product(a, b, in_dims[0], in_dims[1], info.batch_size, gemms), 0


class TunedAddmm(torch.autograd.Function):
    """`kernel(bias, a, b)` = beta * bias + alpha * a @ b, with gradients, jvp and vmap through `gemms`."""

    @staticmethod
    def forward(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, kernel: Callable[..., torch.Tensor],
                gemms: Gemms, alpha: float, beta: float) -> torch.Tensor:
        return kernel(bias, a, b)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        bias, a, b, _, gemms, alpha, beta = inputs
        ctx.gemms, ctx.alpha, ctx.beta, ctx.bias_shape = gemms, alpha, beta, tuple(bias.shape)
        ctx.save_for_backward(a, b)
        ctx.save_for_forward(a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        return (*addmm_grads(grad, a, b, ctx.needs_input_grad, ctx.gemms.mm, ctx.bias_shape, ctx.alpha, ctx.beta),
                None, None, None, None)

    @staticmethod
    def jvp(ctx: Any, dbias: torch.Tensor | None, da: torch.Tensor | None, db: torch.Tensor | None,
            *_: Any) -> torch.Tensor:
        a, b = ctx.saved_tensors
        out = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        if ctx.alpha != 0.0 and (da is not None or db is not None):
            out = ctx.alpha * _product_tangent(a, b, da, db, ctx.gemms.mm)
        return out + ctx.beta * dbias if dbias is not None and ctx.beta != 0.0 else out

    @staticmethod
    def vmap(info: Any, in_dims: tuple, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, kernel: Any,
             gemms: Gemms, alpha: float, beta: float) -> tuple:
        """torch.addmm's semantics per example: alpha == 0 computes no product, beta == 0 reads no bias."""
        size, (bias_dim, a_dim, b_dim) = info.batch_size, in_dims[:3]
        M, N = a.shape[-2], b.shape[-1]
        if alpha == 0.0:
            out = torch.zeros(size, M, N, dtype=a.dtype, device=a.device)
        else:
            out = batched_product(a, b, a_dim, b_dim, size, gemms)
            out = out * alpha if alpha != 1.0 else out
        if beta != 0.0:
            if bias_dim is not None:  # per-example bias of rank r: (size, 1.., *shape) broadcasts to (size, M, N)
                bias = bias.movedim(bias_dim, 0)
                bias = bias.reshape(size, *(1,) * (3 - bias.dim()), *bias.shape[1:])
            out = out + beta * bias
        return out, 0


def _product_tangent(a: torch.Tensor, b: torch.Tensor, da: torch.Tensor | None, db: torch.Tensor | None,
                     gemm: GradMM) -> torch.Tensor:
    """d(a @ b) = da @ b + a @ db (a tangent that is None is zero)."""
    out = gemm(da, b) if da is not None else None
    if db is not None:
        out = gemm(a, db) if out is None else out + gemm(a, db)
    return out if out is not None else torch.zeros(*a.shape[:-1], b.shape[-1], dtype=a.dtype, device=a.device)


# -- what the eager ops hand the Functions (`ops`: gemmtune's eager mm, addmm and bmm by name) ------------

def gemms_for(ops: dict[str, Callable[..., torch.Tensor]], op: str, backends: Any) -> Gemms:
    """The tuned GEMMs the Functions' backward, jvp and batching rule call, for one `backends`."""
    return Gemms(functools.partial(ops["mm"], backends=backends), functools.partial(ops["bmm"], backends=backends),
                 op == "bmm")


def redispatch(ops: dict[str, Callable[..., torch.Tensor]], op: str, alpha: float, beta: float, backends: Any,
               out_layout: Any) -> Callable[..., torch.Tensor]:
    """The eager op itself, bound to one problem's arguments: the kernel a Function runs under a torch.func
    transform (the transform hands it the operands one level down: plain tensors at the last level)."""
    if op == "addmm":
        return functools.partial(ops["addmm"], alpha=alpha, beta=beta, backends=backends, out_layout=out_layout)
    return functools.partial(ops[op], backends=backends, out_layout=out_layout)


def transform_runner(ops: dict[str, Callable[..., torch.Tensor]], op: str, alpha: Any, beta: Any, backends: Any,
                     out_layout: Any) -> Callable[..., torch.Tensor]:
    """A first call under a torch.func transform (grad, vmap, jacrev ...): nothing is tuned on the wrapped
    operands (kernels need data pointers, the gate reads values); the Function takes the call one level
    down, where the plain problem is validated, tuned and kept.  Not kept in the dispatch dict itself."""
    again, gemms = redispatch(ops, op, alpha, beta, backends, out_layout), gemms_for(ops, op, backends)
    if op == "addmm":
        return lambda bias, a, b: TunedAddmm.apply(bias, a, b, again, gemms, alpha, beta)
    return lambda a, b: TunedMM.apply(a, b, again, gemms)
