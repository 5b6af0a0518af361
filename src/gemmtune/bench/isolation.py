"""Subprocess benchmarking: candidates run in a worker process, never in the caller's.

A generated kernel that writes out of bounds, hits an illegal address or hangs
can poison a CUDA context or take a process down.  With
`Settings(isolation="subprocess")` every correctness check and timing runs in
one worker process per device (spawned, pinned with CUDA_VISIBLE_DEVICES); the
caller only compiles (which raises ordinary Python errors) and dispatches the
winner.  A worker that dies or stops answering marks the choice it was running
as failed, is restarted, and tuning goes on with the next choice.

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
import logging
import os
import pickle
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.multiprocessing as tmp

from .bench import Bench
from ..core.choices import Choice, Timing
from .compile import CompileResult, precompile
from ..core.errors import IsolationUnavailable
from ..core.inputs import KernelInputs
from ..templates.base import Template

log = logging.getLogger("gemmtune")


class WorkerLost(RuntimeError):
    """The worker process died or stopped answering."""


@contextmanager
def _env(**changes: str | None) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _serve(conn: Any) -> None:
    """Worker main loop: build a Bench on `setup`, then answer measure / retime / check requests."""
    from .timers import timer_for

    bench = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind = msg[0]
        try:
            if kind == "setup":
                _, op, tensors, alpha, beta, templates, settings, out_layout, device_type = msg
                local = "cuda:0" if device_type == "cuda" else "cpu"  # the one device this worker sees
                tensors = tuple(t.to(local).clone() for t in tensors)  # our own copies
                ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
                by_uid = {t.uid: t for t in templates}
                compiled = CompileResult()

                def ensure(choice: Choice, ki=ki, tensors=tensors, by_uid=by_uid, compiled=compiled):
                    launch = compiled.launcher(choice)
                    if launch is None:
                        res = precompile([choice], by_uid, ki, tensors, timeout_s=settings.compile_timeout_s, workers=1)
                        compiled.launchers.update(res.launchers)
                        if choice.binary_key in res.failures:
                            raise RuntimeError(res.failures[choice.binary_key])
                        launch = compiled.launcher(choice)
                    return launch

                from ..engine import _empty_out

                bench = Bench(ki, tensors, compiled, timer_for(ki.device, settings),
                              check_correctness=settings.check_correctness, ensure=ensure,
                              out_factory=lambda ki=ki: _empty_out(ki, out_layout))
                conn.send(("ok", None))
            elif kind == "run":
                timing = bench.run_one(msg[1], msg[2])
                _exit_if_poisoned(conn, timing.status != "ok", timing.detail)
                conn.send(("ok", timing))
            elif kind == "check":
                problem = bench.check_one(msg[1])
                _exit_if_poisoned(conn, problem is not None, problem)
                conn.send(("ok", problem))
            elif kind == "interleaved":
                conn.send(("ok", bench.time_interleaved(msg[1], msg[2])))
            elif kind == "reset":
                bench = None
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()
                conn.send(("ok", None))
            elif kind == "stop":
                conn.send(("ok", None))
                return
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            text = f"{type(exc).__name__}: {str(exc)[:300]}"
            if not _context_healthy():  # a sticky CUDA error (illegal address, ...): this process is spent
                conn.send(("fatal", text))
                os._exit(3)
            conn.send(("error", text))


def _exit_if_poisoned(conn: Any, failed: bool, detail: str | None) -> None:
    """After a failed run or check: if the CUDA context is poisoned, say so and exit (the parent restarts us)."""
    if failed and not _context_healthy():
        conn.send(("fatal", str(detail)[:300]))
        os._exit(3)


def _context_healthy() -> bool:
    """False when this process's CUDA context is poisoned (every later CUDA call would fail)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return True
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return False


class Worker:
    """One spawned worker process for one device."""

    def __init__(self, device: str, timeout_s: float):
        self.device, self.timeout_s = device, timeout_s
        self.restarts = 0
        self._setup: tuple | None = None
        self._start()

    def _start(self) -> None:
        ctx = tmp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        visible = None
        if self.device.startswith("cuda"):
            index = torch.device(self.device).index or 0
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            visible = visible.split(",")[index] if visible else str(index)
        with _env(CUDA_VISIBLE_DEVICES=visible) if visible is not None else _env():
            self.proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="gemmtune-worker")
            self.proc.start()
        child.close()

    def setup(self, *payload: Any) -> None:
        self._setup = ("setup", *payload)
        self.call(self._setup, timeout_s=max(self.timeout_s, 120.0))

    def call(self, msg: tuple, timeout_s: float | None = None) -> Any:
        timeout_s = timeout_s or self.timeout_s
        try:
            self.conn.send(msg)
            if not self.conn.poll(timeout_s):
                raise WorkerLost(f"no answer within {timeout_s:g} s (hang)")
            status, value = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as exc:
            self.proc.join(timeout=1.0)
            raise WorkerLost(f"worker died (exit code {self.proc.exitcode})") from exc
        if status == "fatal":  # the worker's CUDA context was poisoned; it has exited
            self.proc.join(timeout=5.0)
            raise WorkerLost(f"CUDA context lost: {value}")
        if status == "error":
            raise RuntimeError(value)
        return value

    def restart(self) -> None:
        self.close(kill=True)
        self.restarts += 1
        self._start()
        if self._setup is not None:
            self.call(self._setup, timeout_s=max(self.timeout_s, 120.0))

    def close(self, kill: bool = False) -> None:
        if self.proc.is_alive() and not kill:
            try:
                self.conn.send(("stop",))
                self.conn.poll(2.0)
            except (OSError, EOFError):
                pass
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5.0)
        self.conn.close()


_POOL: dict[str, list[Worker]] = {}
_POOL_LOCK = threading.Lock()


def _acquire(device: str, timeout_s: float) -> Worker:
    """An idle live worker for `device`, or a new one."""
    with _POOL_LOCK:
        idle = _POOL.setdefault(device, [])
        while idle:
            worker = idle.pop()
            if worker.proc.is_alive():
                worker.timeout_s = timeout_s
                return worker
            worker.close(kill=True)
    return Worker(device, timeout_s)


def _release(worker: Worker) -> None:
    """Keep a live worker for the next tune on its device (one per device); stop the rest.

    A kept worker first drops its copies of the inputs and its compiled launchers, so an idle
    worker holds no device memory beyond its CUDA context.
    """
    worker._setup = None  # holds the caller's tensors
    try:
        worker.call(("reset",), timeout_s=10.0)
    except (WorkerLost, RuntimeError):
        worker.close(kill=True)
        return
    with _POOL_LOCK:
        idle = _POOL.setdefault(worker.device, [])
        if worker.proc.is_alive() and not idle:
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
    for worker in workers:
        worker.close()


atexit.register(shutdown_workers)


class IsolatedBench(Bench):
    """A Bench whose checks and timings run in a worker process.

    Example:
        >>> # gemmtune.tune("mm", a, b, settings=gemmtune.Settings(isolation="subprocess"))
    """

    def __init__(self, *args: Any, templates: Mapping[str, Template], settings: Any, out_layout: str | None,
                 run_timeout_s: float, **kw: Any):
        super().__init__(*args, **kw)
        try:
            pickle.dumps((list(templates.values()), settings))
        except Exception as exc:  # noqa: BLE001 - any pickling failure means: cannot isolate
            raise IsolationUnavailable(f"templates cannot be sent to a worker process: "
                                       f"{type(exc).__name__}: {exc}") from exc
        self.worker = _acquire(self.ki.device, run_timeout_s)
        # CUDA IPC handles name the sender's device index; a worker pinned to one GPU sees it as
        # cuda:0, so inputs on another index travel through host shared memory instead.
        index = torch.device(self.ki.device).index if self.ki.device_type == "cuda" else None
        payload = self.tensors if not index else tuple(t.cpu() for t in self.tensors)
        try:
            self.worker.setup(self.ki.op, payload, self.ki.alpha, self.ki.beta, list(templates.values()),
                              settings, out_layout, self.ki.device_type)
        except WorkerLost:  # a kept worker that died while idle: start afresh once
            self.worker.close(kill=True)
            self.worker = Worker(self.ki.device, run_timeout_s)
            self.worker.setup(self.ki.op, payload, self.ki.alpha, self.ki.beta, list(templates.values()),
                              settings, out_layout, self.ki.device_type)

    def _lost(self, choice: Choice, stage: str, exc: WorkerLost) -> Timing:
        log.warning("gemmtune: %s %s: %s; worker restarted", choice.name, choice.description, exc)
        self.worker.restart()
        return Timing(choice, None, stage, "run_failed", f"isolated run failed: {exc}")

    def run_one(self, choice: Choice, stage: str) -> Timing:
        try:
            return self.worker.call(("run", choice, stage))
        except WorkerLost as exc:
            return self._lost(choice, stage, exc)
        except RuntimeError as exc:
            return Timing(choice, None, stage, "run_failed", str(exc))

    def check_one(self, choice: Choice) -> str | None:
        try:
            return self.worker.call(("check", choice))
        except (WorkerLost, RuntimeError) as exc:
            if isinstance(exc, WorkerLost):
                self.worker.restart()
            return f"isolated check failed: {exc}"

    def time_interleaved(self, choices: Sequence[Choice], rounds: int) -> tuple[list[float], list[tuple]]:
        try:
            return self.worker.call(("interleaved", list(choices), rounds))
        except (WorkerLost, RuntimeError) as exc:  # keep the earlier, separate timings of the finalists
            log.warning("gemmtune: interleaved re-timing failed (%s); using the earlier timings", exc)
            if isinstance(exc, WorkerLost):
                self.worker.restart()
            earlier = [self.records.get(c) for c in choices]
            return ([t.ms if t is not None and t.ms is not None else float("inf") for t in earlier],
                    [(t.gpu_ms, t.host_ms) if t is not None else (None, None) for t in earlier])

    def close(self) -> None:
        _release(self.worker)
