"""A graph's new GEMM problems timed together: Inductor's pipelined GEMM autotuning, in the default mode.

With `install(pipeline=True)`, a default-mode compile on a GPU times the problems the store does not
know (`inductor.timed`) the way Inductor's `config.pipeline_max_autotune_gemm` does: each problem's
lowering hands its shortlisted candidates to Inductor's precompile thread pool and returns at once,
so the compiles of every problem in the graph overlap each other and the rest of the lowering; one
worker process (Inductor's `AutotuneProcessPool`, started here at the graph's first such problem with
the main script hidden from it, so a script without a `__main__` guard is not run again) times them
one after another, so timings stay serial and fair; the scheduler waits for a problem's timings only
when it picks its kernel.  The timings still reach the handler and the store: `feed()` wraps
`AsyncAutotuner.get_results`.  Off by default: on the H200 its first calls took 1.5-1.9x as long
as timing each problem while it is lowered (docs/RESULTS.md).

The flags are held from the first such lowering of a graph until its scheduler has picked every
GEMM (`Scheduler.finalize_multi_template_buffers`), then set back: Inductor's precompile thread
reads them after the lowering returns.  Epilogue benchmarking is off while held (Inductor's rule for
the pipelined path; the fusion of an epilogue into the picked template is then estimated).  A
compile that autotunes GEMMs itself (max-autotune) is left as it is.  Subgraph candidates
(decompose-k), which the pipelined path cannot time, are dropped from such a problem's list.

Example:
    >>> held()
    False
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import Any, Callable, Iterable

__all__ = ["available", "pipelined", "hold", "held", "release", "reapply", "timeable", "feed", "unfeed"]

log = logging.getLogger("gemmtune")
_FLAGS = {"pipeline_max_autotune_gemm": True, "benchmark_epilogue_fusion": False}
_LOCK = threading.Lock()
_HELD: dict[str, Any] = {}  # "graph": the graph being compiled, "prior": the flags' values before it
_LISTENERS: list[Callable[[dict], None]] = []


def available() -> bool:
    """Whether the installed torch has Inductor's pipelined GEMM autotuning (and it is not shut down)."""
    try:
        from torch._inductor import autotune_process, config
        from torch._inductor.scheduler import Scheduler
    except Exception:  # noqa: BLE001 - an Inductor that fails to import: nothing to pipeline
        return False
    return (hasattr(config, "pipeline_max_autotune_gemm") and hasattr(autotune_process, "AsyncAutotuner")
            and hasattr(Scheduler, "finalize_multi_template_buffers")
            and not getattr(getattr(autotune_process, "AutotuneProcessPool", None), "_shutdown_for_inactivity", False))


def pipelined(handler: Any, ktcs: list, default_window: bool) -> list:
    """The candidates `handler` hands Inductor to time for a new problem: with `handler.pipeline`, in a
    default-mode compile's GEMM lowering (`default_window`), timed by pipelined autotuning with the
    graph's other new problems (the subgraph ones dropped); else `ktcs` as they are."""
    from torch._inductor.virtualized import V

    from . import timed

    if not getattr(handler, "pipeline", False) or not default_window or not hold(V.graph):
        return ktcs
    feed(timed.feedback)
    handler.stats["pipelined"] += 1
    return timeable(ktcs)


def held() -> bool:
    """Whether the flags are held for a graph now."""
    return bool(_HELD)


def hold(graph: Any) -> bool:
    """Inside a GEMM lowering of `graph` (Inductor's `V.graph`): switch on pipelined autotuning until its
    scheduler has picked its GEMMs; False where this torch cannot pipeline.  A graph whose compile
    failed before its scheduler ran hands its hold on (a max-autotune compile's window and
    `uninstall()` set the flags back: `release()`).  Epilogue benchmarking is switched off by
    `reapply()`, after the window's own patch of it ends."""
    if not available():
        return False
    from torch._inductor import config

    _hook_scheduler()
    with _LOCK:
        if _HELD:  # this graph's, or one whose compile failed before its scheduler ran: the user's values carry over
            _HELD["graph"] = graph
        else:
            _HELD.update(graph=graph, prior={})
            _warm_up()
        _set(config, "pipeline_max_autotune_gemm")
    return True


def reapply() -> None:
    """Outside the lowering's config patch: set every held flag (keeping the value it replaces)."""
    from torch._inductor import config

    with _LOCK:
        if _HELD:
            for k in _FLAGS:
                _set(config, k)


def _set(config: Any, key: str) -> None:
    _HELD["prior"].setdefault(key, getattr(config, key))
    setattr(config, key, _FLAGS[key])


def _warm_up() -> None:
    """Start Inductor's benchmark worker now (its CUDA start overlaps the compile), spawned without
    re-running this program's main script: a script without a `__main__` guard stays safe."""
    from torch._inductor import autotune_process, config

    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        for k in saved:
            setattr(main, k, None) if k == "__spec__" else delattr(main, k)
        with config.patch(pipeline_max_autotune_gemm=True):
            autotune_process.AutotuneProcessPool.get_instance().warm_up()
    except Exception as exc:  # noqa: BLE001 - Inductor starts it at its first benchmark instead
        log.info("gemmtune.inductor: benchmark worker not started early (%s: %s)", type(exc).__name__, exc)
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def release(graph: Any = None) -> None:
    """Set the flags back (those of `graph` only, when given)."""
    with _LOCK:
        if _HELD and (graph is None or _HELD["graph"] is graph):
            _restore()


def _restore() -> None:
    from torch._inductor import config

    for k, v in _HELD["prior"].items():
        setattr(config, k, v)
    _HELD.clear()


def timeable(ktcs: Iterable[Any]) -> list[Any]:
    """The candidates the pipelined path can time: subgraph ones (decompose-k) dropped."""
    try:
        from torch._inductor.codegen.subgraph import SubgraphTemplate
    except Exception:  # noqa: BLE001 - no subgraph templates in this torch
        return list(ktcs)
    return [k for k in ktcs if not isinstance(getattr(k, "template", None), SubgraphTemplate)]


def feed(listener: Callable[[dict], None]) -> None:
    """Call `listener(timings)` with every result set Inductor's pipelined autotuner hands back
    ({ChoiceCaller: ms}, as a feedback saver gets it); once per listener."""
    from torch._inductor import autotune_process

    if listener not in _LISTENERS:
        _LISTENERS.append(listener)
    tuner = autotune_process.AsyncAutotuner
    if getattr(tuner.get_results, "__gemmtune__", False):
        return
    orig = tuner.__dict__["get_results"].__func__

    @functools.wraps(orig)
    def get_results(cls: Any, *args: Any, **kwargs: Any) -> dict:
        timings = orig(cls, *args, **kwargs)
        for fn in list(_LISTENERS):
            try:
                fn(timings)
            except Exception as exc:  # noqa: BLE001 - a listener never fails Inductor's compile
                log.warning("gemmtune.inductor: pipelined timings not heard (%s: %s)", type(exc).__name__, exc)
        return timings

    get_results.__gemmtune__ = True  # type: ignore[attr-defined]
    tuner.get_results = classmethod(get_results)  # type: ignore[assignment]


def unfeed(listener: Callable[[dict], None]) -> None:
    """Stop calling `listener` (a no-op when it is not fed)."""
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def _hook_scheduler() -> None:
    """Release a graph's flags once its scheduler has picked every GEMM (once per process)."""
    from torch._inductor.scheduler import Scheduler

    orig = Scheduler.finalize_multi_template_buffers
    if getattr(orig, "__gemmtune__", False):
        return

    @functools.wraps(orig)
    def finalize(self: Any) -> None:
        try:
            orig(self)
        finally:
            from torch._inductor.virtualized import V

            release(V.graph)

    finalize.__gemmtune__ = True  # type: ignore[attr-defined]
    Scheduler.finalize_multi_template_buffers = finalize  # type: ignore[method-assign]
