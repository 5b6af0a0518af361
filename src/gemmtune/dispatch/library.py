"""`torch.library` custom ops: `gemmtune::mm`, `gemmtune::addmm`, `gemmtune::bmm`.

They make the eager API traceable: under `torch.compile(fullgraph=True)`
`gemmtune.mm` & co. trace to these ops (Dynamo and Inductor see one opaque
call with a fake implementation for shapes), and at run time each op calls the
eager function of `gemmtune.dispatch.eager`, so tuning and dispatch are the same code in
eager and compiled programs.

Signatures (string arguments because custom ops take `str?`, not tuples):

    gemmtune::mm(Tensor a, Tensor b, str? backends=None, str? out_layout=None) -> Tensor
    gemmtune::bmm(Tensor a, Tensor b, str? backends=None, str? out_layout=None) -> Tensor
    gemmtune::addmm(Tensor bias, Tensor a, Tensor b, float beta=1., float alpha=1.,
                    str? backends=None, str? out_layout=None) -> Tensor

`backends` is a comma-separated family list (`"extern,numba"`).  The output is
a fresh tensor (never an input's alias), row-major, or with column-major
matrices (strides (1, M)) for `out_layout="col"`, or with padded rows for
`out_layout="padded"` (`core.layout`); the fake implementations promise
exactly those strides and the real ones keep the promise.

Backward (`register_autograd`) is the standard GEMM gradient, computed with
these same ops, so gradients are tuned too and are differentiable again:
    mm:    dA = dC @ B^T,  dB = A^T @ dC
    addmm: dbias = beta * sum-to-shape(dC),  dA = alpha * dC @ B^T,  dB = alpha * A^T @ dC
    bmm:   the same per batch.

Example:
    >>> import torch, gemmtune.dispatch.library
    >>> a, b = torch.randn(4, 3), torch.randn(3, 2)
    >>> torch.allclose(torch.ops.gemmtune.mm(a, b, "extern"), a @ b)
    True
"""

from typing import Optional, Sequence

import torch

from ..core.layout import output_strides
from . import eager as api
from .autograd import addmm_grads, addmm_setup, mm_grads, mm_setup

__all__ = ["mm", "addmm", "bmm"]


def _fresh(out: torch.Tensor, inputs: Sequence[torch.Tensor], out_layout: Optional[str]) -> torch.Tensor:
    """`out` with exactly the strides the fake promised and no storage shared with an input."""
    want = output_strides(tuple(out.shape), out_layout, out.dtype.itemsize)
    if out.stride() == want and not any(out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                                        and out.numel() > 0 for t in inputs):
        return out
    fixed = torch.empty_strided(tuple(out.shape), want, dtype=out.dtype, device=out.device)
    fixed.copy_(out)
    return fixed


def _fake(like: torch.Tensor, size: tuple, out_layout: Optional[str]) -> torch.Tensor:
    return like.new_empty_strided(size, output_strides(size, out_layout, like.dtype.itemsize))


def _runtime_op(op: str, backends: Optional[str]):
    """The GEMM a backward runs: this module's op again (tuned, and differentiable again)."""
    fn = getattr(torch.ops.gemmtune, op).default
    return lambda x, y: fn(x, y, backends, None)


# -- mm ---------------------------------------------------------------------------------------------

@torch.library.custom_op("gemmtune::mm", mutates_args=())
def mm(a: torch.Tensor, b: torch.Tensor, backends: Optional[str] = None,
       out_layout: Optional[str] = None) -> torch.Tensor:
    """`a @ b` through gemmtune's dispatch (see `gemmtune.mm`).

    Example:
        >>> import torch, gemmtune.dispatch.library
        >>> torch.ops.gemmtune.mm(torch.ones(2, 3), torch.ones(3, 4), "extern").shape
        torch.Size([2, 4])
    """
    with torch.no_grad():
        out = api.mm(a, b, backends=backends, out_layout=out_layout)
    return _fresh(out, (a, b), out_layout)


@mm.register_fake
def _mm_fake(a, b, backends=None, out_layout=None):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "gemmtune::mm: mat1 and mat2 must be 2-D")
    torch._check(a.shape[1] == b.shape[0], lambda: f"gemmtune::mm: inner dimensions differ: {a.shape} @ {b.shape}")
    return _fake(a, (a.shape[0], b.shape[1]), out_layout)


def _mm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    return (*mm_grads(grad, a, b, ctx.needs_input_grad, _runtime_op("mm", ctx.backends)), None, None)


mm.register_autograd(_mm_backward, setup_context=mm_setup)


# -- bmm --------------------------------------------------------------------------------------------

@torch.library.custom_op("gemmtune::bmm", mutates_args=())
def bmm(a: torch.Tensor, b: torch.Tensor, backends: Optional[str] = None,
        out_layout: Optional[str] = None) -> torch.Tensor:
    """Batched `a @ b` through gemmtune's dispatch (see `gemmtune.bmm`).

    Example:
        >>> import torch, gemmtune.dispatch.library
        >>> torch.ops.gemmtune.bmm(torch.ones(5, 2, 3), torch.ones(5, 3, 4), "extern").shape
        torch.Size([5, 2, 4])
    """
    with torch.no_grad():
        out = api.bmm(a, b, backends=backends, out_layout=out_layout)
    return _fresh(out, (a, b), out_layout)


@bmm.register_fake
def _bmm_fake(a, b, backends=None, out_layout=None):
    torch._check(a.dim() == 3 and b.dim() == 3, lambda: "gemmtune::bmm: batch1 and batch2 must be 3-D")
    torch._check(a.shape[2] == b.shape[1], lambda: f"gemmtune::bmm: inner dimensions differ: {a.shape} @ {b.shape}")
    return _fake(a, (a.shape[0], a.shape[1], b.shape[2]), out_layout)


def _bmm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    return (*mm_grads(grad, a, b, ctx.needs_input_grad, _runtime_op("bmm", ctx.backends)), None, None)


bmm.register_autograd(_bmm_backward, setup_context=mm_setup)


# -- addmm ------------------------------------------------------------------------------------------

@torch.library.custom_op("gemmtune::addmm", mutates_args=())
def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: float = 1.0, alpha: float = 1.0,
          backends: Optional[str] = None, out_layout: Optional[str] = None) -> torch.Tensor:
    """`beta * bias + alpha * (a @ b)` through gemmtune's dispatch (see `gemmtune.addmm`).

    Example:
        >>> import torch, gemmtune.dispatch.library
        >>> torch.ops.gemmtune.addmm(torch.ones(4), torch.ones(2, 3), torch.ones(3, 4), 1.0, 1.0, "extern")[0, 0]
        tensor(4.)
    """
    with torch.no_grad():
        out = api.addmm(bias, a, b, beta=beta, alpha=alpha, backends=backends, out_layout=out_layout)
    return _fresh(out, (bias, a, b), out_layout)


@addmm.register_fake
def _addmm_fake(bias, a, b, beta=1.0, alpha=1.0, backends=None, out_layout=None):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "gemmtune::addmm: mat1 and mat2 must be 2-D")
    torch._check(a.shape[1] == b.shape[0], lambda: f"gemmtune::addmm: inner dimensions differ: {a.shape} @ {b.shape}")
    return _fake(a, (a.shape[0], b.shape[1]), out_layout)


def _addmm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    return (*addmm_grads(grad, a, b, ctx.needs_input_grad, _runtime_op("mm", ctx.backends), ctx.bias_shape,
                         ctx.alpha, ctx.beta), None, None, None, None)


addmm.register_autograd(_addmm_backward, setup_context=addmm_setup)
