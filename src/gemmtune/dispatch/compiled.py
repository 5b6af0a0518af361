"""`gemmtune.mm` & co. inside `torch.compile`: decided at trace time, emitted as the pick itself.

Under `torch.compile` the eager functions trace to the ops below (`torch.library.triton_op`).
Their body runs while the graph is traced, on fake tensors whose sizes are known (static shapes):
it tunes the problem then (or reads the store, or finds it already dispatched in this process) and
emits the winner as the graph's own code:

- a library pick is the aten op (`torch.mm`, `torch.addmm`, `torch.bmm`): Inductor calls cuBLAS
  (or the CPU BLAS) directly, as for a plain `torch.mm`;
- a Triton pick is its kernel, launched through `torch.library.wrap_triton`, so the generated code
  launches it directly, with no Python between calls.

Only templates that can be emitted this way (`Template.trace`) take part in a traced problem's
tuning; its pick is stored under its own key (`|traced`), apart from the eager pick.

Dynamic shapes (symbolic sizes at trace time) cannot be tuned then: such a call is emitted as the
opaque `gemmtune::mm` custom op (`gemmtune.dispatch.library`), which tunes on the first real call
of each concrete shape and dispatches through the eager dict on every call after it; so is a call
whose `out_layout="padded"` pads N's rows (its pick writes padded rows, which a traced op cannot).

Gradients are GEMMs of the same kind and are traced the same way.

Example:
    >>> import torch, gemmtune.dispatch.compiled
    >>> a, b = torch.randn(4, 3), torch.randn(3, 2)
    >>> torch.allclose(torch.ops.gemmtune.traced_mm(a, b, "extern", None), a @ b)
    True
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import torch
from torch.library import triton_op
from torch.utils._python_dispatch import _disable_current_modes

from .. import engine
from . import library  # noqa: F401  registers torch.ops.gemmtune.mm / addmm / bmm, which a symbolic trace emits
from ..core.settings import Settings, check_backends
from ..core.validate import validate_operands
from ..core.inputs import KernelInputs, stand_in
from ..core.layout import call_layout, in_layout
from ..templates import active_templates, default_templates, inductor_pool
from . import autocast, route
from .autograd import addmm_grads, addmm_setup, mm_grads, mm_setup
from .table import TABLE, dispatch_key, is_empty

__all__ = ["traced_mm", "traced_bmm", "traced_addmm", "is_static"]

_TRACED: dict[tuple, tuple[Any, Any] | None] = {}  # canonical dispatch key -> (Selection, Template) decided for a trace


def is_static(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every size and stride is a plain int (not symbolic): only then can a trace tune.

    Example:
        >>> is_static([torch.randn(2, 3)])
        True
    """
    return all(type(s) is int for t in tensors for s in (*t.shape, *t.stride()))


def _decide(op: str, tensors: tuple, alpha: float, beta: float, backends: Sequence[str] | str | None,
            out_layout: Optional[str]) -> tuple[Any, Any] | None:
    """(Selection, Template) for a traced problem: known already, or tuned now on stand-in tensors.

    None for an empty problem, or one no traceable template can run.  The store keeps traced picks under their own key (`store_tag`),
    since they are chosen from the traceable templates only.
    """
    canon_backends = check_backends(backends)
    with TABLE.lock:
        key = dispatch_key(op, tensors, alpha, beta, canon_backends, out_layout)
        if key not in _TRACED:
            validate_operands(op, tensors, alpha, beta)
            _TRACED[key] = None if is_empty(tensors) else _tune_traced(
                op, tensors, alpha, beta, canon_backends, out_layout)
        return _TRACED[key]


def _tune_traced(op: str, tensors: tuple, alpha: float, beta: float, backends: tuple[str, ...] | None,
                 out_layout: str | None) -> tuple[Any, Any] | None:
    """Tune among the traceable templates; None when none of them can run the problem (e.g.
    `backends=("numba",)`): the trace then emits the opaque op, which dispatches at run time."""
    s = Settings.from_env()
    pool = {t.uid: t for t in default_templates(s.hopper_templates, s.config_space, s.preview_templates)
            if t.traceable}
    # leave fake/functional tracing: tuning runs real kernels, in the (autocast-cast) problem's own dtype
    with _disable_current_modes(), torch.no_grad(), autocast.disabled(tensors):
        real = tuple(stand_in(t.shape, t.stride(), t.dtype, t.device) for t in tensors)
        ki = KernelInputs.from_tensors(op, *real, alpha=alpha, beta=beta)
        if not active_templates(ki, backends, list(pool.values())):
            return None
        sel = engine.tune(op, *real, backends=backends, alpha=alpha, beta=beta, out_layout=out_layout,
                          templates=list(pool.values()), store_tag="traced")
    return sel, pool[sel.winner.template_uid]


def prepare_traced(op: str, tensors: tuple, alpha: float, beta: float, backends: tuple[str, ...] | None,
                   out_layout: str | None) -> Any:
    """The Selection a trace of this problem emits (tuned now if new); None for an empty problem."""
    decided = _decide(op, tensors, alpha, beta, backends, out_layout)
    return decided[0] if decided is not None else None


def _emit(op: str, tensors: tuple, alpha: float, beta: float, backends: Optional[str],
          out_layout: Optional[str]) -> torch.Tensor:
    # A traced pick writes row-major rows: a padded call's pick runs as itself, as a dynamic call's is tuned then.
    if not is_static(tensors) or call_layout(out_layout, tensors[-1]) == "padded":
        return _opaque(op, tensors, alpha, beta, backends, out_layout)
    if route.to_inductor(tensors, backends, out_layout):  # Inductor builds gemmtune's pick of the aten op
        return torch.addmm(*tensors, beta=beta, alpha=alpha) if op == "addmm" else getattr(torch, op)(*tensors)
    decided = _decide(op, tensors, alpha, beta, backends, out_layout)
    if decided is None:  # an empty problem, or no traceable template for it: dispatch at run time
        return _opaque(op, tensors, alpha, beta, backends, out_layout)
    sel, template = decided
    out = template.trace(sel.winner, sel.problem)(tensors, None, **sel.winner.runtime_dict)
    # A traced graph keeps no out= strides: the column-major result is a copy of the row-major one.
    return in_layout(out, out_layout)


def _opaque(op: str, tensors: tuple, alpha: float, beta: float, backends: Optional[str],
            out_layout: Optional[str]) -> torch.Tensor:
    if op == "addmm":
        return torch.ops.gemmtune.addmm.default(*tensors, beta, alpha, backends, out_layout)
    return getattr(torch.ops.gemmtune, op).default(*tensors, backends, out_layout)


class _NoTritonNote(logging.Filter):
    """Drops the "Triton not available, find_triton_kernels = []" warning that `triton_op` logs at each
    registration where Triton is not installed (a CPU machine): these ops then hold no Triton kernel."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Triton not available")


def _registered(name: str) -> Callable[[Callable[..., torch.Tensor]], Any]:
    """`torch.library.triton_op(name, mutates_args=())`, registered without that warning."""
    def register(fn: Callable[..., torch.Tensor]) -> Any:
        log, quiet = logging.getLogger("torch._library.triton"), _NoTritonNote()
        log.addFilter(quiet)
        try:
            return triton_op(name, mutates_args=())(fn)
        finally:
            log.removeFilter(quiet)

    return register


@_registered("gemmtune::traced_mm")
def traced_mm(a: torch.Tensor, b: torch.Tensor, backends: Optional[str] = None,
              out_layout: Optional[str] = None) -> torch.Tensor:
    """`a @ b`, emitted as the tuned pick when traced (see the module docstring)."""
    return _emit("mm", (a, b), 1.0, 1.0, backends, out_layout)


@_registered("gemmtune::traced_bmm")
def traced_bmm(a: torch.Tensor, b: torch.Tensor, backends: Optional[str] = None,
               out_layout: Optional[str] = None) -> torch.Tensor:
    """Batched `a @ b`, emitted as the tuned pick when traced."""
    return _emit("bmm", (a, b), 1.0, 1.0, backends, out_layout)


@_registered("gemmtune::traced_addmm")
def traced_addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: float = 1.0, alpha: float = 1.0,
                 backends: Optional[str] = None, out_layout: Optional[str] = None) -> torch.Tensor:
    """`beta * bias + alpha * (a @ b)`, emitted as the tuned pick when traced."""
    return _emit("addmm", (bias, a, b), alpha, beta, backends, out_layout)


def _mm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    op = torch.ops.gemmtune.traced_mm.default if a.dim() == 2 else torch.ops.gemmtune.traced_bmm.default
    return (*mm_grads(grad, a, b, ctx.needs_input_grad, lambda x, y: op(x, y, ctx.backends, None)), None, None)


def _addmm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    mm = torch.ops.gemmtune.traced_mm.default
    return (*addmm_grads(grad, a, b, ctx.needs_input_grad, lambda x, y: mm(x, y, ctx.backends, None),
                         ctx.bias_shape, ctx.alpha, ctx.beta), None, None, None, None)


TABLE.on_clear(_TRACED.clear)
traced_mm.register_autograd(_mm_backward, setup_context=mm_setup)
traced_bmm.register_autograd(_mm_backward, setup_context=mm_setup)
traced_addmm.register_autograd(_addmm_backward, setup_context=addmm_setup)


def prepare_inductor(op: str, tensors: tuple, alpha: float, beta: float, backends: tuple[str, ...] | None,
                     out_layout: str | None) -> Any:
    """Tune a problem for the Inductor path (`dispatch.route`) ahead of the compile: among the
    templates Inductor builds exactly, stored under the key the installed handler reads
    (`store_tag="inductor"`), so the compile finds it in the store.  None for an empty problem."""
    if is_empty(tensors):
        return None
    validate_operands(op, tensors, alpha, beta)
    s = Settings.from_env()
    with torch.no_grad(), autocast.disabled(tensors):
        pool = inductor_pool(tensors[-1].device.type, s)
        return engine.tune(op, *tensors, alpha=alpha, beta=beta, templates=pool, store_tag="inductor")
