"""The eager API: `gemmtune.mm`, `gemmtune.addmm`, `gemmtune.bmm`.

The first call for a problem tunes it (`gemmtune.tune`); every later call looks the winner up in
an in-process dict (one per op) and runs it.  That warm path is kept lean: the key is a plain tuple
of the operands' shapes, strides, dtypes and devices, the addmm scalars and their types, `backends`
and `out_layout` (no validation, no logging: a miss validates, then tunes); the dict holds `torch.mm` /
`torch.bmm` themselves for an aten winner, else the Selection's kernel behind an autograd check.
Calls that need a gradient through a generated kernel (numba, Triton, NumPy) run it inside a
`torch.autograd.Function` (`gemmtune.dispatch.autograd`) whose backward computes the standard GEMM
gradients with gemmtune again.  Under `torch.compile` the functions trace to the aten op, built by
Inductor from gemmtune's pick (`dispatch.route`), or to `gemmtune.dispatch.compiled`'s ops.
The dicts, the Selections, the counters and the lock belong to the process's dispatch table
(`gemmtune.dispatch.table.TABLE`).  The first call of a problem holds its lock (tuning is never
concurrent, so its timings are not disturbed by a second tuning thread); the warm path takes none.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Sequence

import torch

from .. import engine
from ..core.errors import InputError, NoCandidatesError
from ..core import autocast as _ac
from ..core.binding import bound_on_first_call
from ..core.layout import OUT_LAYOUTS, call_layout, in_layout
from ..templates import staging
from . import buckets
from .autograd import TunedAddmm, TunedMM, gemms_for, redispatch, transform_runner
from .table import TABLE, Recorded, dispatch_key, is_empty

__all__ = ["mm", "addmm", "bmm", "clear_dispatch_cache", "dispatch_stats", "dispatched", "Recorded"]

# Bound once (the table never replaces these objects): the warm path reads module globals only.
_MM, _ADDMM, _BMM = (TABLE.runners[op] for op in ("mm", "addmm", "bmm"))
_HITS = TABLE.hits  # next() on it is atomic

# Bound once: each saves an attribute lookup on the warm path.
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_torch_mm = torch.mm
_torch_bmm = torch.bmm
_autocast_on = _ac.enabled
_func_active = torch._C._are_functorch_transforms_active  # torch.func.grad / vmap / jacrev ... around the call


# -- the public functions ------------------------------------------------------------------------

def mm(a: torch.Tensor, b: torch.Tensor, *, backends: Sequence[str] | str | None = None,
       out_layout: str | None = None) -> torch.Tensor:
    """`a @ b` for 2-D `a` [M, K] and `b` [K, N], run by the tuned winner.

    The first call for a problem (shapes, strides, dtypes, device, `backends`,
    `out_layout`) tunes it; later calls dispatch straight to the winner.
    `backends` is a tuple of family names (`gemmtune.FAMILIES`; pass a tuple,
    not a list, to stay on the fast path); `out_layout` is None, `"row"`,
    `"col"` (strides (1, M); only a selection of library kernels can honour
    it, otherwise `gemmtune.LayoutError`) or `"padded"` (where N's rows are
    not whole 16 bytes, a view of rows padded to them, the kind Inductor returns;
    the library's kernels and their padded twins compete).  Supports autograd and
    `torch.compile(fullgraph=True)` (through the `gemmtune::mm` custom op).

    Example:
        >>> import torch, gemmtune
        >>> a, b = torch.randn(8, 4), torch.randn(4, 3)
        >>> torch.allclose(gemmtune.mm(a, b, backends=("extern",)), a @ b)
        True
    """
    if _is_compiling():
        a, b = _ac.cast((a, b))
        return _traced().traced_mm.default(a, b, _backends_arg(backends), out_layout)
    if _autocast_on():  # one C call; casts only under torch.autocast (gemmtune.dispatch.autocast)
        a, b = _ac.cast((a, b))
    try:
        fn = _MM[(a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device, backends,
                   out_layout)]
    except Exception:  # noqa: BLE001 - a miss; or not tensors, no strides, unhashable backends: it says why
        fn = _miss("mm", (a, b), 1.0, 1.0, backends, out_layout)
    else:
        next(_HITS)
    return fn(a, b)


def bmm(a: torch.Tensor, b: torch.Tensor, *, backends: Sequence[str] | str | None = None,
        out_layout: str | None = None) -> torch.Tensor:
    """Batched `a @ b` for 3-D `a` [B, M, K] and `b` [B, K, N], run by the tuned winner.

    Same dispatch, autograd and compile behaviour as `gemmtune.mm`;
    `out_layout="col"` gives each [M, N] matrix strides (1, M), "padded" padded rows (as `mm`).

    Example:
        >>> import torch, gemmtune
        >>> a, b = torch.randn(2, 8, 4), torch.randn(2, 4, 3)
        >>> torch.allclose(gemmtune.bmm(a, b, backends=("extern",)), torch.bmm(a, b))
        True
    """
    if _is_compiling():
        a, b = _ac.cast((a, b))
        return _traced().traced_bmm.default(a, b, _backends_arg(backends), out_layout)
    if _autocast_on():  # one C call; casts only under torch.autocast (gemmtune.dispatch.autocast)
        a, b = _ac.cast((a, b))
    try:
        fn = _BMM[(a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device, backends,
                   out_layout)]
    except Exception:  # noqa: BLE001 - a miss; or not tensors, no strides, unhashable backends: it says why
        fn = _miss("bmm", (a, b), 1.0, 1.0, backends, out_layout)
    else:
        next(_HITS)
    return fn(a, b)


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1, alpha: float = 1,
          backends: Sequence[str] | str | None = None, out_layout: str | None = None) -> torch.Tensor:
    """`beta * bias + alpha * (a @ b)`, as `torch.addmm`, run by the tuned winner.

    `bias` is 0-, 1- or 2-D and broadcasts to the [M, N] output.  `alpha` and
    `beta` are part of the problem (a new pair is tuned once).  Same dispatch,
    autograd and compile behaviour as `gemmtune.mm`.

    Example:
        >>> import torch, gemmtune
        >>> bias, a, b = torch.randn(3), torch.randn(8, 4), torch.randn(4, 3)
        >>> out = gemmtune.addmm(bias, a, b, beta=0.5, alpha=2.0, backends=("extern",))
        >>> torch.allclose(out, torch.addmm(bias, a, b, beta=0.5, alpha=2.0))
        True
    """
    if _is_compiling():
        bias, a, b = _ac.cast((bias, a, b))
        return _traced().traced_addmm.default(bias, a, b, float(beta), float(alpha),
                                                       _backends_arg(backends), out_layout)
    if _autocast_on():
        bias, a, b = _ac.cast((bias, a, b))
    try:
        fn = _ADDMM[(bias.shape, bias.stride(), bias.dtype, bias.device, a.shape, a.stride(), a.dtype, a.device,
                     b.shape, b.stride(), b.dtype, b.device, alpha, alpha.__class__, beta, beta.__class__, backends,
                     out_layout)]
    except Exception:  # noqa: BLE001 - a miss; or not tensors, no strides, unhashable backends: it says why
        fn = _miss("addmm", (bias, a, b), alpha, beta, backends, out_layout)
    else:
        next(_HITS)
    return fn(bias, a, b)


_OPS: dict[str, Callable[..., torch.Tensor]] = {"mm": mm, "addmm": addmm, "bmm": bmm}  # the Functions call them again

TRACED_OPS: list[Callable[[], None]] = []  # registrars of torch.ops.gemmtune.traced_* (added by the package)


def _traced() -> Any:
    """`torch.ops.gemmtune`, the traced ops registered (on a compile's first trace: dynamo runs the import)."""
    for register in TRACED_OPS:
        register()
    return torch.ops.gemmtune


def clear_dispatch_cache() -> None:
    """Forget every dispatched problem and reset the counters (the next call of each problem tunes again).

    The in-process dispatch dict is cleared and the padded kernels' kept storage freed (`templates.staging`);
    whatever `gemmtune.tune` keeps elsewhere (a persistent store) is untouched.

    Example:
        >>> import gemmtune
        >>> gemmtune.clear_dispatch_cache()
        >>> gemmtune.dispatch_stats()["entries"]
        0
    """
    TABLE.clear()
    staging.forget()


def dispatch_stats() -> dict[str, Any]:
    """Counters and contents of the dispatch dict.

    `hits`: calls served from the dict; `misses`: calls that were not (each tunes, or reuses an
    entry under a different spelling of the same key, or falls back to torch for an empty problem);
    `tunes`: `gemmtune.tune` calls; `entries`: keys held; `selections`: `{problem: winner name}` per
    tuned problem (`problem` is the Selection's `KernelInputs.problem_key`, followed by the `backends`
    and `out_layout` it was tuned for); `bucket_*`, `outside_buckets`, `buckets_wanted`: `dispatch.buckets`.

    Example:
        >>> import torch, gemmtune
        >>> gemmtune.clear_dispatch_cache()
        >>> a = torch.randn(4, 4)
        >>> _ = gemmtune.mm(a, a, backends=("extern",)); _ = gemmtune.mm(a, a, backends=("extern",))
        >>> s = gemmtune.dispatch_stats(); (s["hits"], s["misses"], s["tunes"])
        (1, 1, 1)
    """
    return {**TABLE.stats(), **buckets.stats()}


def selections() -> dict[tuple, Any]:
    """The Selection behind every tuned problem, by canonical dispatch key (a copy).

    Example:
        >>> import torch, gemmtune.dispatch.eager as api
        >>> _ = api.mm(torch.randn(4, 2), torch.randn(2, 4), backends=("extern",))
        >>> any(s.winner.is_extern for s in api.selections().values())
        True
    """
    return TABLE.selections()


def dispatched(op: str, tensors: tuple, alpha: float = 1.0, beta: float = 1.0,
               backends: Sequence[str] | None = None, out_layout: str | None = None) -> tuple[Any, Callable] | None:
    """(Selection, the callable the dict runs) for a problem this process has tuned, else None.

    None also while `recording()` is on (the dict is set aside then).  Used by `gemmtune.patch`
    to give a patched layer its own fast path once its problem is decided.

    Example:
        >>> import torch, gemmtune.dispatch.eager as api
        >>> a, b = torch.randn(4, 2), torch.randn(2, 4)
        >>> _ = api.mm(a, b, backends=("extern",))
        >>> sel, fn = api.dispatched("mm", (a, b), backends=("extern",))
        >>> sel.winner.name, fn is torch.mm
        ('aten_mm', True)
    """
    from ..core.settings import check_backends

    return TABLE.dispatched(op, canonical_key(op, tensors, alpha, beta, check_backends(backends), out_layout))


def canonical_key(op: str, tensors: tuple, alpha: float, beta: float, backends: Any, out_layout: Any) -> tuple:
    """The key a tuned problem's entry and Selection are kept under (what `recording()` yields)."""
    return dispatch_key(op, _resolved(tensors), float(alpha), float(beta), backends, out_layout)


# -- the miss path -------------------------------------------------------------------------------

def _miss(op: str, tensors: tuple, alpha: Any, beta: Any, backends: Any,
          out_layout: Any) -> Callable[..., torch.Tensor]:
    """Find or build the runner for a problem not in the dict (validates; tunes at most once per problem)."""
    if _func_active():  # nothing is tuned on wrapped operands: the plain problem is, one level down
        return transform_runner(_OPS, op, alpha, beta, backends, out_layout)
    with TABLE.lock:
        try:
            key: tuple | None = dispatch_key(op, tensors, alpha, beta, backends, out_layout)
            hash(key)
        except Exception:  # noqa: BLE001 - not tensors (validation below says so) or unhashable backends
            key = None
        fn = None if key is None else TABLE.runner(op, key)
        if fn is not None:  # another thread tuned it while we waited
            next(_HITS)
            return fn
        tensors, canon_backends, laid = _validated(op, tensors, alpha, beta, backends, out_layout)
        alpha_f, beta_f = float(alpha), float(beta)
        canon = dispatch_key(op, tensors, alpha_f, beta_f, canon_backends, out_layout)
        if TABLE.recorder is not None:
            TABLE.record(canon, op, tensors, alpha_f, beta_f, canon_backends, out_layout)
            return library_runner(op, alpha_f, beta_f, laid)
        fn = TABLE.runner(op, canon)
        if fn is None:
            fn = _build(op, tensors, alpha_f, beta_f, canon_backends, laid, canon)
        TABLE.put(op, fn, canon, key)
        TABLE.count_miss()
        return fn


def _validated(op: str, tensors: tuple, alpha: Any, beta: Any, backends: Any,
               out_layout: Any) -> tuple[tuple, tuple[str, ...] | None, str | None]:
    """The operands (negation views resolved), canonical backends and output layout (`call_layout`)
    of a valid call; else InputError."""
    from ..core.settings import check_backends
    from ..core.validate import check_backends_arg, validate_operands

    tensors = _resolved(tensors)
    validate_operands(op, tensors, alpha, beta)
    check_backends_arg(backends)
    canon_backends = check_backends(backends)
    if out_layout not in OUT_LAYOUTS:
        raise InputError(f"{op}: out_layout must be None, 'row', 'col' or 'padded', got {out_layout!r}")
    return tensors, canon_backends, call_layout(out_layout, tensors[-1])


def _build(op: str, tensors: tuple, alpha: float, beta: float, backends: tuple[str, ...] | None,
           out_layout: str | None, canon: tuple) -> Callable[..., torch.Tensor]:
    if is_empty(tensors):
        return library_runner(op, alpha, beta, out_layout)
    with torch.no_grad(), _ac.disabled(tensors):  # tune runs every candidate: no graphs, NumPy needs grad-free tensors
        plain = tuple(t.detach() for t in tensors)  # a family tuned over M (dispatch.buckets): its bucket's pick
        if (sel := buckets.pinned(op, plain, alpha, beta, backends, out_layout)) is None:
            sel = engine.tune(op, *plain, backends=backends, alpha=alpha, beta=beta, out_layout=out_layout)
            TABLE.count_tune()
    if sel.kernel is None:
        raise NoCandidatesError(f"{sel.problem.describe()}: the selection has no kernel to run")
    TABLE.add_selection(canon, sel)
    return selection_runner(op, sel, alpha, beta, backends, out_layout)


def selection_runner(op: str, sel: Any, alpha: float, beta: float, backends: tuple[str, ...] | None,
                     out_layout: str | None) -> Callable[..., torch.Tensor]:
    """The callable the dispatch dict holds for a problem `sel` tuned (what `gemmtune.mm` and its
    siblings run on a warm call; `bench/cpu.py` times it)."""
    uid = sel.winner.template_uid
    if out_layout in (None, "row"):
        # The aten winners' launchers are exactly torch.mm(a, b) / torch.bmm(a, b): call those
        # directly (no Python frames in between; autograd is torch's own).
        if op == "mm" and uid == "aten_mm":
            return _torch_mm
        if op == "bmm" and uid == "aten_bmm":
            return _torch_bmm
    cell = bound_on_first_call(sel.kernel)  # cell[0]: the kernel, bound to this problem once called
    gemms = gemms_for(_OPS, op, backends)
    again = redispatch(_OPS, op, alpha, beta, backends, out_layout)  # under torch.func: one level down
    if op == "addmm":
        def run_addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            if _func_active():
                return TunedAddmm.apply(bias, a, b, again, gemms, alpha, beta)
            if a.is_neg() or b.is_neg() or bias.is_neg():  # lazy negation views: kernels read raw memory
                bias, a, b = bias.resolve_neg(), a.resolve_neg(), b.resolve_neg()
            if (a.requires_grad or b.requires_grad or bias.requires_grad) and _grad_enabled():
                return TunedAddmm.apply(bias, a, b, cell[0], gemms, alpha, beta)
            return cell[0](bias, a, b)

        return run_addmm

    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if _func_active():
            return TunedMM.apply(a, b, again, gemms)
        if a.is_neg() or b.is_neg():  # lazy negation views (x.conj().imag): kernels read raw memory
            a, b = a.resolve_neg(), b.resolve_neg()
        if (a.requires_grad or b.requires_grad) and _grad_enabled():
            return TunedMM.apply(a, b, cell[0], gemms)
        return cell[0](a, b)

    return run


def _resolved(tensors: tuple) -> tuple:
    """The operands with lazy negation views (negative bit, e.g. `x.conj().imag`) made real.

    The eager ops accept them (torch.mm does); `gemmtune.tune` refuses them
    with an InputError, since its kernels read raw memory.
    """
    if any(isinstance(t, torch.Tensor) and not t.is_nested and t.layout == torch.strided and t.is_neg()
           for t in tensors):
        return tuple(t.resolve_neg() if isinstance(t, torch.Tensor) else t for t in tensors)
    return tensors


def library_runner(op: str, alpha: float, beta: float, out_layout: str | None) -> Callable[..., torch.Tensor]:
    """torch's own op for a problem: empty problems (nothing to tune), recording, the in-model check."""
    if op == "mm":
        fn: Callable[..., torch.Tensor] = torch.mm
    elif op == "bmm":
        fn = torch.bmm
    else:
        def fn(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.addmm(bias, a, b, beta=beta, alpha=alpha)
    if out_layout in (None, "row"):
        return fn
    return lambda *t: in_layout(fn(*t), out_layout)


# -- helpers shared with gemmtune.dispatch.library ---------------------------------------------------------------

def _backends_arg(backends: Sequence[str] | str | None) -> str | None:
    """`backends` as the custom ops take it: None or "extern,numba"."""
    if backends is None or isinstance(backends, str):
        return backends
    return ",".join(backends)


# -- recording (model warm-up) ---------------------------------------------------------------------

def recording() -> AbstractContextManager[dict[tuple, Recorded]]:
    """Within the block, gemmtune's ops tune nothing: torch computes each call and its problem is recorded.

    Problems already dispatched are recorded too (the dispatch dict is set aside for the block and
    restored after it).  Yields the record, canonical dispatch key -> `Recorded`.

    Example:
        >>> import torch, gemmtune.dispatch.eager as eager
        >>> with eager.recording() as seen:
        ...     _ = eager.mm(torch.randn(4, 3), torch.randn(3, 2))
        >>> [r.describe() for r in seen.values()]
        ['mm(4x3, 3x2)']
    """
    return TABLE.recording()


def prepare(op: str, tensors: tuple, alpha: float, beta: float, backends: tuple[str, ...] | None,
            out_layout: str | None) -> Any:
    """Tune one problem (or read it from the store) into the dispatch dict; its Selection (None when empty).

    Example:
        >>> import torch, gemmtune.dispatch.eager as eager
        >>> sel = eager.prepare("mm", (torch.randn(4, 3), torch.randn(3, 2)), 1.0, 1.0, ("extern",), None)
        >>> sel.winner.is_extern
        True
    """
    _miss(op, tensors, alpha, beta, backends, out_layout)
    return TABLE.selection(canonical_key(op, tensors, alpha, beta, backends, out_layout))
