"""Default-mode compiles with gemmtune's GEMMs: a template window around Inductor's GEMM lowerings.

A default `torch.compile` offers Inductor's GEMM lowerings (`tuned_mm`, `tuned_addmm`, `tuned_bmm`,
`tuned_scaled_mm`) only the library kernel, so a Triton pick could never be built there.  `open_window()`
wraps those lowerings: while the installed gemmtune handler is the active choices handler and the compile
does not autotune GEMMs itself, each lowering runs with `config.max_autotune_gemm` switched on for
its own duration.  Inductor then offers its templates, the handler answers with exactly one choice
(the pick), and with one choice Inductor builds it without timing anything (a problem the store does
not know yet is timed once, on Inductor's own kernels: `inductor.timed`).  Everything else of the
compile (pointwise kernels, coordinate descent, fusion) stays at default-mode cost.

In that window an `mm` whose K is 1 (a training step's weight gradient at M = 1) is lowered as the
broadcast multiply it is, a pointwise kernel (newer Inductor decomposes it so on a GPU itself), and one
whose M or N is 1 as a tuned reduction when the handler asks for it (`inductor.gemv`).  Each wrapped
lowering first brings its thread's handler up to date (`open_window`'s `sync`): a backward graph is
compiled in autograd's device thread, whose handler Inductor made once, maybe before `install()`.

`has_epilogue(node)` says whether a GEMM's FX node feeds a pointwise op of its own size, the
epilogue Inductor can fuse into a Triton template but not into a library call.

Example:
    >>> in_window()
    False
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import torch

__all__ = ["open_window", "in_window", "user_autotunes", "window_applies", "cpu_pick_alone", "has_epilogue",
           "current_node"]

_STATE = threading.local()
_SYNC: Callable[[], Any] | None = None  # open_window's `sync`
_VIEWS = {"view", "_unsafe_view", "reshape", "permute", "t", "transpose", "squeeze", "unsqueeze", "alias",
          "clone", "contiguous"}


def in_window() -> bool:
    """Whether this thread is inside a GEMM lowering opened by the window."""
    return getattr(_STATE, "depth", 0) > 0


def user_autotunes() -> bool:
    """Whether the compile itself autotunes GEMMs (a max-autotune mode), inside the window or not."""
    from torch._inductor import config

    if in_window():
        return bool(getattr(_STATE, "autotunes", False))
    return bool(config.max_autotune or config.max_autotune_gemm)


def window_applies(args: tuple, is_ours: Callable[[Any], bool], at: int = -1) -> bool:
    """Open the window for this lowering: the gemmtune handler is active and the GEMM runs on a CUDA
    device (elsewhere Inductor's templates are not the ones gemmtune maps onto).  In a max-autotune
    compile it changes nothing but what `in_window()` says.  `args[at]` is the B matrix."""
    from torch._inductor.virtualized import V

    try:
        if not is_ours(V.choices):
            return False
        device = args[at].get_device()  # mat2 of mm/bmm/addmm, mat_b of _scaled_mm: an Inductor IR node
    except Exception:  # noqa: BLE001 - not the IR we know: leave the lowering as it is
        return False
    return getattr(device, "type", None) == "cuda"


@contextlib.contextmanager
def _opened() -> Iterator[None]:
    from torch._inductor import config

    from . import pipeline

    autotunes = user_autotunes()
    if autotunes:
        pipeline.release()  # a max-autotune compile never runs pipelined: flags a failed compile held
    _STATE.depth, prior = getattr(_STATE, "depth", 0) + 1, getattr(_STATE, "autotunes", False)
    _STATE.autotunes = autotunes
    try:
        # epilogue benchmarking off: a GEMM that Inductor times (a problem new to the store) is timed
        # while it is lowered, and the timings reach the handler at once (inductor/timed.py)
        patch = {"max_autotune_gemm": True} if autotunes else {"max_autotune_gemm": True,
                                                               "benchmark_epilogue_fusion": False}
        with config.patch(patch):
            yield
    finally:
        _STATE.depth -= 1
        _STATE.autotunes = prior
        if _STATE.depth == 0:
            pipeline.reapply()  # a problem timed by pipelined autotuning: its flags outlive this patch


def cpu_pick_alone(args: tuple, is_ours: Callable[[Any], bool], at: int = -1) -> str | None:
    """In a max-autotune compile of a CPU GEMM under gemmtune's handler: the GEMM backends without
    Inductor's C++ micro-GEMM (else None).  Inductor adds that template to a CPU bmm (and to a mm of
    frozen weights) itself, past the choices handler, so it would be benchmarked against the pick;
    without it the handler's one choice is built as it is, with nothing timed."""
    from torch._inductor import config
    from torch._inductor.virtualized import V

    try:
        if not user_autotunes() or not is_ours(V.choices) or getattr(args[at].get_device(), "type", None) != "cpu":
            return None
    except Exception:  # noqa: BLE001 - not the IR we know: leave the lowering as it is
        return None
    backends = [b.strip() for b in str(config.max_autotune_gemm_backends).split(",") if b.strip()]
    kept = [b for b in backends if b.upper() != "CPP"]
    return ",".join(kept or ["ATEN"]) if len(kept) < len(backends) else None


def _as_product(args: tuple, kwargs: dict) -> Any:
    """This mm, in the window of a default-mode compile, lowered as the product it is (`inductor.gemv`):
    a reduction when M or N is 1 and the handler asks for it (`install(gemv=...)`), a broadcast
    multiply when K is 1; None keeps it a GEMM (and where this torch's codegen cannot be hooked)."""
    from torch._inductor.virtualized import V

    from . import gemv

    if user_autotunes() or len(args) < 2 or not gemv.hook_codegen():
        return None
    how = getattr(V.choices, "gemv", False)
    if how and gemv.applies(args[0], args[1], kwargs):
        kind, lower = "vector_product", lambda: gemv.gemv_lowering(args[0], args[1], how)
    elif gemv.applies(args[0], args[1], kwargs, gemv.is_outer_product):
        kind, lower = "outer_product", lambda: gemv.outer_lowering(args[0], args[1])
    else:
        return None
    stats = getattr(V.choices, "stats", None)
    if stats is not None:
        stats[kind] += 1
    return lower()


def _wrap(fn: Callable[..., Any], is_ours: Callable[[Any], bool], op: Any = None) -> Callable[..., Any]:
    scaled = getattr(getattr(torch.ops.aten, "_scaled_mm", None), "default", None)
    at = 1 if op is not None and op is scaled else -1  # where B is: _scaled_mm's args end in scales and options

    @functools.wraps(fn)
    def lowering(*args: Any, **kwargs: Any) -> Any:
        if _SYNC is not None:  # this thread's handler follows install() / uninstall() (a backward's thread)
            _SYNC()
        opened = window_applies(args, is_ours, at)
        if opened and op is torch.ops.aten.mm.default:
            product = _as_product(args, kwargs)
            if product is not None:
                return product
        if not opened:
            backends = cpu_pick_alone(args, is_ours, at)
            if backends is None:
                return fn(*args, **kwargs)
            from torch._inductor import config

            with config.patch(max_autotune_gemm_backends=backends):
                return fn(*args, **kwargs)
        with _opened():
            return fn(*args, **kwargs)

    lowering.__gemmtune_window__ = fn  # type: ignore[attr-defined]
    return lowering


def open_window(is_ours: Callable[[Any], bool], sync: Callable[[], Any] | None = None) -> int:
    """Wrap Inductor's mm / addmm / bmm / _scaled_mm lowerings once per process (a no-op where they are wrapped);
    returns how many lowerings are wrapped.  `is_ours(handler)` says whether a choices handler is
    gemmtune's: only then does the window open, so an uninstalled handler leaves Inductor as it was.
    `sync()`, called first in every wrapped lowering, brings the lowering thread's handler up to date."""
    from torch._inductor import lowering

    global _SYNC
    _SYNC = sync if sync is not None else _SYNC

    aten = torch.ops.aten
    wrapped = 0
    scaled = getattr(getattr(aten, "_scaled_mm", None), "default", None)
    for op in (aten.mm.default, aten.addmm.default, aten.bmm.default, *([scaled] if scaled is not None else [])):
        fn = lowering.lowerings.get(op)
        if fn is None:
            continue
        if not hasattr(fn, "__gemmtune_window__"):
            lowering.lowerings[op] = _wrap(fn, is_ours, op)
        wrapped += 1
    return wrapped


def current_node() -> Any:
    """The FX node Inductor is lowering (the GEMM), or None outside a lowering."""
    from torch._inductor.virtualized import V

    try:
        return V.graph.current_node
    except Exception:  # noqa: BLE001 - no graph being lowered (a direct call in a test)
        return None


def _numel(node: Any) -> int | None:
    val: Any = getattr(node, "meta", {}).get("val")
    try:
        return int(val.numel())
    except Exception:  # noqa: BLE001 - no meta value (or a symbolic size): unknown
        return None


def has_epilogue(node: Any, depth: int = 3) -> bool:
    """Whether the GEMM's FX `node` feeds, directly or through views of the same size, a pointwise op
    whose output has its size (a residual add, a bias, an activation): an epilogue Inductor fuses
    into a Triton template.  A split of the output (q/k/v, gate/up) is no such epilogue.

    Example:
        >>> has_epilogue(None)
        False
    """
    size = _numel(node)
    if node is None or size is None:
        return False
    frontier = list(node.users)
    for _ in range(depth):
        nxt = []
        for user in frontier:
            target = getattr(user, "target", None)
            if _numel(user) != size or not isinstance(target, torch._ops.OpOverload):
                continue
            if torch.Tag.pointwise in target.tags:
                return True
            if target._opname in _VIEWS:
                nxt.extend(user.users)
        frontier = nxt
    return False
