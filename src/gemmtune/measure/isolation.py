"""Subprocess benchmarking: candidates run in a worker process, never in the caller's.

A generated kernel that writes out of bounds, hits an illegal address or hangs
can poison a CUDA context or take a process down.  With
`Settings(isolation="subprocess")` every correctness check and timing runs in
one worker process per device (`python -m gemmtune.measure.worker`, pinned with
CUDA_VISIBLE_DEVICES); the caller only compiles (which raises ordinary Python
errors) and dispatches the winner.  A worker that dies or stops answering marks
the choice it was running as failed, is restarted, and tuning goes on with the
next choice.

The inputs reach the worker through torch's shared-memory / CUDA-IPC pickling
and are cloned there, so a kernel that writes out of bounds in the worker
writes into the worker's own copies.

Workers are kept for the life of the process (one idle worker per device is
reused by the next tune), so the worker start (torch import, CUDA context,
~2-3 s) is paid once per process, not once per tune.

`Settings.isolation="auto"` (the default) isolates on GPUs and measures
in-process on CPU; in-process measurement (`isolation="off"`) saves the
worker start and one pipe round trip per choice (docs/RELIABILITY.md).
"""

from __future__ import annotations

import atexit
import io
import logging
import pickle
import threading
import types
from concurrent.futures import Future
from typing import Any, Callable, Mapping, Sequence

import torch

from ..core.choices import Choice, Timing
from ..core.errors import IsolationUnavailable
from ..core.inputs import KernelInputs
from ..templates.base import Template
from .jobs import Check, Reset, SecondOpinion, Setup, Time, TimeInterleaved
from .process import Worker, WorkerLost
from .runners import RunFailed

log = logging.getLogger("gemmtune")
SETUP_TIMEOUT_S = 120.0  # copying the inputs and building the timer, on a loaded machine

_POOL: dict[str, list[Worker]] = {}
_POOL_LOCK = threading.Lock()


_STARTING: dict[str, Future] = {}  # device -> a worker starting in the background (`prestart`)


def _acquire(device: str, timeout_s: float) -> Worker:
    """An idle live worker for `device`, the one `prestart` is starting, or a new one."""
    with _POOL_LOCK:
        idle = _POOL.setdefault(device, [])
        while idle:
            worker = idle.pop()
            if worker.alive:
                worker.timeout_s = timeout_s
                return worker
            worker.close(kill=True)
        starting = _STARTING.pop(device, None)
    if starting is not None:
        try:
            worker = starting.result()
        except Exception as exc:  # noqa: BLE001 - the background start failed: start one here, which raises
            log.info("gemmtune: a worker started in the background failed (%s); starting another", exc)
        else:
            if worker.alive:
                worker.timeout_s = timeout_s
                return worker
            worker.close(kill=True)
    return Worker(device, timeout_s)


def prestart(device: str, timeout_s: float) -> Callable[[], None]:
    """Start `device`'s worker in a background thread, so that its start (a fresh interpreter
    importing torch, a CUDA context: seconds) overlaps the caller's work before the first timing.
    Returns `cancel`: it stops the worker if no tune took it (nothing was tuned after all).
    Nothing happens where an idle worker or a start is already there.  A worker touches the GPU
    only when a tune sends it a problem, so a cancelled start costs one interpreter's import, no
    device memory.

    Example:
        >>> cancel = prestart("cuda:0", 60.0) if torch.cuda.is_available() else (lambda: None)
        >>> cancel()
    """
    future: Future = Future()
    with _POOL_LOCK:
        if any(w.alive for w in _POOL.get(device, [])) or device in _STARTING:
            return lambda: None
        _STARTING[device] = future

    def start() -> None:
        try:
            future.set_result(Worker(device, timeout_s))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            future.set_exception(exc)

    threading.Thread(target=start, name="gemmtune-worker-start", daemon=True).start()

    def cancel() -> None:
        with _POOL_LOCK:
            unused = _STARTING.get(device) is future
            if unused:
                del _STARTING[device]
        if unused:
            _close_when_started(future)

    return cancel


def _close_when_started(future: Future) -> None:
    """Stop the worker of a background start once it has started (at once where it already has)."""
    future.add_done_callback(lambda f: f.exception() is None and f.result().close())


def _release(worker: Worker) -> None:
    """Keep a live worker for the next tune on its device (one per device); stop the rest.

    A kept worker first drops its copies of the inputs and its compiled launchers, so an idle
    worker holds no device memory beyond its CUDA context.
    """
    worker.forget_setup()  # the setup job holds the caller's tensors
    try:
        worker.call(Reset(), timeout_s=10.0)
    except RuntimeError:  # WorkerLost included
        worker.close(kill=True)
        return
    with _POOL_LOCK:
        idle = _POOL.setdefault(worker.device, [])
        if worker.alive and not idle:
            idle.append(worker)
            return
    worker.close()


def shutdown_workers() -> None:
    """Stop every kept worker (also run at interpreter exit).

    Example:
        >>> shutdown_workers()
    """
    with _POOL_LOCK:
        workers = [w for idle in _POOL.values() for w in idle]
        _POOL.clear()
        starting = list(_STARTING.values())
        _STARTING.clear()
    for worker in workers:
        worker.close()
    for future in starting:
        _close_when_started(future)


atexit.register(shutdown_workers)


class _MainFinder(pickle.Pickler):
    """Pickles to nowhere, refusing classes and functions of `__main__`: the worker is a fresh
    interpreter that never imports the caller's main module, so it could not load them."""

    def persistent_id(self, obj: Any) -> None:
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            raise pickle.PicklingError(f"{obj.__qualname__} is defined in __main__, which a worker does not import")
        return None


def _require_sendable(*objects: Any) -> None:
    try:
        _MainFinder(io.BytesIO()).dump(objects)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means: cannot isolate
        raise IsolationUnavailable(f"templates cannot be sent to a worker process: "
                                   f"{type(exc).__name__}: {exc}") from exc


class SubprocessRunner:
    """A runner whose checks and timings run in a worker process (see the module docstring).

    Raises IsolationUnavailable when the templates cannot be sent to or loaded by a worker.

    Example:
        >>> # gemmtune.tune("mm", a, b, settings=gemmtune.Settings(isolation="subprocess"))
    """

    isolation = "subprocess"

    def __init__(self, ki: KernelInputs, tensors: Sequence[torch.Tensor], templates: Mapping[str, Template],
                 settings: Any, out_layout: str | None):
        _require_sendable(tuple(templates.values()), settings)
        # CUDA IPC handles name the sender's device index; a worker pinned to one GPU sees it as
        # cuda:0, so inputs on another index travel through host shared memory instead.
        index = torch.device(ki.device).index if ki.device_type == "cuda" else None
        payload = tuple(tensors) if not index else tuple(t.cpu() for t in tensors)
        setup = Setup(ki.op, payload, ki.alpha, ki.beta, tuple(templates.values()), settings, out_layout,
                      ki.device_type, tuple(ki.options().items()) if ki.op == "scaled_mm" else ())
        self.worker = _acquire(ki.device, settings.run_timeout_s)
        try:
            self._set_up(setup, ki.device, settings.run_timeout_s)
        except RuntimeError as exc:  # not WorkerLost: the worker answered that it cannot load the problem
            _release(self.worker)
            raise IsolationUnavailable(f"the worker process cannot set up the problem: {exc}") from exc

    def _set_up(self, setup: Setup, device: str, timeout_s: float) -> None:
        try:
            self.worker.setup(setup, timeout_s=max(timeout_s, SETUP_TIMEOUT_S))
        except WorkerLost:  # a kept worker that died while idle: start afresh once
            self.worker.close(kill=True)
            self.worker = Worker(device, timeout_s)
            self.worker.setup(setup, timeout_s=max(timeout_s, SETUP_TIMEOUT_S))

    def check(self, choice: Choice) -> str | None:
        try:
            return self.worker.call(Check(choice))
        except RuntimeError as exc:  # WorkerLost included
            if isinstance(exc, WorkerLost):
                self.worker.restart()
            return f"isolated check failed: {exc}"

    def time(self, choice: Choice, stage: str, *, check: bool) -> Timing:
        try:
            return self.worker.call(Time(choice, stage, check))
        except WorkerLost as exc:
            log.warning("gemmtune: %s %s: %s; worker restarted", choice.name, choice.description, exc)
            self.worker.restart()
            return Timing(choice, None, stage, "run_failed", f"isolated run failed: {exc}")
        except RuntimeError as exc:
            return Timing(choice, None, stage, "run_failed", str(exc))

    def time_interleaved(self, choices: Sequence[Choice], rounds: int) -> list[Timing]:
        try:
            return self.worker.call(TimeInterleaved(tuple(choices), rounds))
        except RuntimeError as exc:  # WorkerLost included
            if isinstance(exc, WorkerLost):
                self.worker.restart()
            raise RunFailed(str(exc)) from exc

    def second_opinion(self, choices: Sequence[Choice]) -> tuple[str, list[float]] | None:
        try:
            return self.worker.call(SecondOpinion(tuple(choices)))
        except RuntimeError as exc:  # WorkerLost included
            if isinstance(exc, WorkerLost):
                self.worker.restart()
            raise RunFailed(str(exc)) from exc

    def close(self) -> None:
        _release(self.worker)


__all__ = ["IsolationUnavailable", "SubprocessRunner", "Worker", "WorkerLost", "shutdown_workers"]
