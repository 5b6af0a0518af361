"""Parallel precompile with a per-choice timeout, and compile-on-demand (`Launchers`).

Choices that share a binary (same template + config) compile once.  A job of gemmtune's library kernels
only (a store hit's library pick) is built in the caller's thread: there is nothing to compile.  A binary
that fails to compile, overflows the device's resources or exceeds the timeout
is dropped and logged; the remaining choices go on.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import torch

from ..core.choices import Choice
from ..core.errors import NoCandidatesError
from ..core.inputs import KernelInputs
from ..templates.base import Launcher, Template
from ..templates.binaries import BinaryFiles, collect
from ..templates.compiler_cache import scope

log = logging.getLogger("gemmtune")


@dataclass
class CompileResult:
    launchers: dict[tuple, Launcher] = field(default_factory=dict)
    failures: dict[tuple, str] = field(default_factory=dict)
    seconds: float = 0.0
    binary_seconds: dict[tuple, float] = field(default_factory=dict)  # compile time of each binary
    binaries: dict[tuple, tuple[BinaryFiles, ...]] = field(default_factory=dict)  # each binary's files on disk

    def launcher(self, choice: Choice) -> Launcher | None:
        return self.launchers.get(choice.binary_key)

    def ready(self, choice: Choice) -> bool:
        """Whether `choice`'s binary is done compiling (always, once a CompileResult exists)."""
        return True

    def may_run(self, choice: Choice) -> bool:
        """Built, or (CompileJob) still compiling."""
        return self.launcher(choice) is not None

    def wait_any(self, choices: Sequence[Choice]) -> None:
        """Nothing to wait for (see CompileJob)."""

    @property
    def running(self) -> bool:
        """Some binaries are still compiling (never, once a CompileResult exists; see CompileJob)."""
        return False

    def abandon(self) -> None:
        """Stop waiting for binaries still compiling (none here; see CompileJob)."""


class Launchers:
    """The launcher of any choice: from `compiled`, or compiled now where `compiled` has none.

    The engine uses one for choices whose timings came from the store (never compiled in this
    tune); a worker process uses one for every choice (it compiles, or loads from the compiler's
    cache, what the caller already built).  Raises NoCandidatesError when the choice no longer
    compiles.

    Example:
        >>> import torch
        >>> from gemmtune.core.inputs import KernelInputs
        >>> from gemmtune.templates.extern import AtenTemplate
        >>> a, b = torch.randn(4, 3), torch.randn(3, 2)
        >>> ki, aten = KernelInputs.from_tensors("mm", a, b), AtenTemplate("mm")
        >>> launch = Launchers({aten.uid: aten}, ki, (a, b), timeout_s=60)(Choice(aten.uid, None))
        >>> torch.allclose(launch((a, b), None), a @ b)
        True
    """

    def __init__(self, templates: Mapping[str, Template], ki: KernelInputs, example: Sequence[torch.Tensor], *,
                 timeout_s: float, compiled: CompileResult | None = None):
        self.templates, self.ki, self.example, self.timeout_s = templates, ki, example, timeout_s
        self.compiled = compiled if compiled is not None else CompileResult()

    def __call__(self, choice: Choice) -> Launcher:
        self.compiled.wait_any([choice])  # a CompileJob may still be building it
        launch = self.compiled.launcher(choice)
        if launch is None:
            extra = precompile([choice], self.templates, self.ki, self.example, timeout_s=self.timeout_s, workers=1)
            self.compiled.launchers.update(extra.launchers)
            self.compiled.failures.update(extra.failures)
            self.compiled.seconds += extra.seconds
            self.compiled.binaries.update(extra.binaries)
            launch = self.compiled.launcher(choice)
            if launch is None:
                raise NoCandidatesError(f"{self.ki.describe()}: {choice.name} no longer compiles: "
                                        f"{extra.failures.get(choice.binary_key)}")
        return launch


def _prepare(choices: Iterable[Choice], templates: Mapping[str, Template], ki: KernelInputs,
             example: Sequence[torch.Tensor]) -> None:
    """Each template's `prepare_compiles` with its binaries; a failure there only costs the head start."""
    by_template: dict[str, list[Choice]] = {}
    for c in choices:
        by_template.setdefault(c.template_uid, []).append(c)
    for uid, mine in by_template.items():
        try:
            templates[uid].prepare_compiles(mine, ki, example)
        except Exception as exc:  # noqa: BLE001 - compile() still builds each binary
            log.info("gemmtune: %s: preparing %d compiles failed (%s: %s)", uid, len(mine), type(exc).__name__, exc)


def precompile(choices: Sequence[Choice], templates: Mapping[str, Template], ki: KernelInputs,
               example: Sequence[torch.Tensor], *, timeout_s: float, workers: int = 0,
               on_done: Callable[[int, int], None] | None = None, deadline: float | None = None) -> CompileResult:
    """Compile every distinct binary among `choices` in a thread pool; return when all are done.

    `on_done(done, total)` is called after each binary (for progress bars).  Past
    `deadline` (a `time.perf_counter()` value) the binaries still pending are
    abandoned and recorded as failures ("budget").
    """
    return CompileJob(choices, templates, ki, example, timeout_s=timeout_s, workers=workers,
                      on_done=on_done, deadline=deadline).finish()


class CompileJob(CompileResult):
    """Binaries compiling in a thread pool, usable one by one as they finish (a job of library kernels
    only: built in the caller's thread, `_library`).

    A CompileResult that fills in while its binaries compile: `ready(choice)` says whether
    `choice`'s binary is done (built or failed), `wait_any(choices)` blocks until one of theirs
    is, `finish()` waits for all.  Timeouts and the deadline are enforced while waiting.

    Example:
        >>> job = CompileJob([], {}, None, (), timeout_s=1.0)
        >>> job.finish().launchers, job.ready(None)
        ({}, True)
    """

    def __init__(self, choices: Sequence[Choice], templates: Mapping[str, Template], ki: KernelInputs,
                 example: Sequence[torch.Tensor], *, timeout_s: float, workers: int = 0,
                 on_done: Callable[[int, int], None] | None = None, deadline: float | None = None):
        super().__init__()
        self._start = time.perf_counter()
        self._timeout_s, self._deadline, self._on_done = timeout_s, deadline, on_done
        self._unique: dict[tuple, Choice] = {}
        for c in choices:
            self._unique.setdefault(c.binary_key, c)
        workers = workers or min(32, os.cpu_count() or 1)
        inline = all(_library(c) for c in self._unique.values())  # nothing to compile: no thread, no timeout
        self._pool = None if inline else ThreadPoolExecutor(max_workers=max(1, min(workers, len(self._unique) or 1)),
                                                            thread_name_prefix="gemmtune-compile")
        self._started: dict[tuple, float] = {}  # binary key -> when its compile began
        self._keys: dict[Future, tuple] = {}
        self._done_count = 0

        def build(c: Choice) -> Launcher:
            t0 = self._started[c.binary_key] = time.perf_counter()
            with scope(), collect() as files:  # the compiler's cache manager of gemmtune's compiles (share_kernels)
                launcher = templates[c.template_uid].compile(c, ki, example)
            self.binary_seconds[c.binary_key] = time.perf_counter() - t0
            self.binaries[c.binary_key] = tuple(files)
            return launcher

        _prepare(self._unique.values(), templates, ki, example)
        for key, c in self._unique.items():
            if self._pool is None:
                self._built(key, build, c)
            else:
                self._keys[self._pool.submit(build, c)] = key
        self._pending = set(self._keys)
        self._open = bool(self._pending)
        if not self._open:
            self._close()

    def may_run(self, choice: Choice) -> bool:
        return choice.binary_key in self.launchers or (choice.binary_key in self._unique
                                                       and choice.binary_key not in self.failures)

    @property
    def running(self) -> bool:
        """Some binaries are still compiling."""
        return bool(self._pending)

    def ready(self, choice: Choice) -> bool:
        """True when `choice`'s binary is built or failed (or was never part of this job)."""
        key = choice.binary_key if choice is not None else None
        return key not in self._unique or key in self.launchers or key in self.failures

    def wait_any(self, choices: Sequence[Choice]) -> None:
        """Block until at least one of `choices`' binaries is done (or nothing is pending)."""
        while self._pending and not any(self.ready(c) for c in choices):
            self._poll_or_cancel()

    def finish(self) -> CompileResult:
        """Wait for every binary; the pool is shut down.  Returns self."""
        while self._pending:
            self._poll_or_cancel()
        self._close()
        return self

    def _poll_or_cancel(self) -> None:
        """One poll; on Ctrl-C (KeyboardInterrupt) the queued compiles are cancelled before it propagates,
        so the interpreter's exit joins only the few compiles already running, not the whole queue."""
        try:
            self._poll(self._wait_s())
        except KeyboardInterrupt:
            self.abandon()
            raise

    def _wait_s(self) -> float:
        """How long one poll waits: a quarter second, or less where the deadline comes sooner."""
        if self._deadline is None:
            return 0.25
        return min(0.25, max(0.005, self._deadline - time.perf_counter()))

    def abandon(self) -> None:
        """Stop waiting: binaries still compiling finish in the background, unused."""
        for fut in list(self._pending):
            fut.cancel()
        self._pending = set()
        self._close()

    def _close(self) -> None:
        if self._open or not self.seconds:
            # A timed-out compile cannot be interrupted; it finishes in the background, unused.
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self.seconds = time.perf_counter() - self._start
            self._open = False

    def _resolved(self, key: tuple) -> None:
        self._done_count += 1
        if self._on_done:
            self._on_done(self._done_count, len(self._unique))

    def _built(self, key: tuple, build: Callable[[Choice], Launcher], c: Choice) -> None:
        """Build `c` in this thread (a library kernel: its "compile" wraps torch's op)."""
        try:
            self.launchers[key] = build(c)
        except Exception as exc:  # noqa: BLE001 - a failed build drops the choice, as in the pool
            self._failed(key, exc)
        self._resolved(key)

    def _failed(self, key: tuple, exc: BaseException) -> None:
        self.failures[key] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        log.warning("gemmtune: dropped %s: compile failed: %s", self._unique[key].name, self.failures[key])

    def _poll(self, timeout: float) -> None:
        done, self._pending = wait(self._pending, timeout=timeout, return_when=FIRST_COMPLETED)
        for fut in done:
            key = self._keys[fut]
            exc = fut.exception()
            if exc is None:
                self.launchers[key] = fut.result()
            else:
                self._failed(key, exc)
            self._resolved(key)
        now = time.perf_counter()
        if self._deadline is not None and now > self._deadline and self._pending:
            for fut in list(self._pending):
                fut.cancel()
                self.failures[self._keys[fut]] = "BudgetExceeded: tuning time budget spent before this compiled"
            self._pending = set()
        for fut in list(self._pending):
            t0 = self._started.get(self._keys[fut])
            if t0 is not None and now - t0 > self._timeout_s:
                key = self._keys[fut]
                self._pending.discard(fut)
                fut.cancel()
                self.failures[key] = f"TimeoutError: compile exceeded {self._timeout_s:g} s"
                log.warning("gemmtune: dropped %s: %s", self._unique[key].name, self.failures[key])
                self._resolved(key)
        if not self._pending:
            self._close()


def _library(choice: Choice) -> bool:
    """A library kernel of gemmtune's (`family` "extern", no source): its "compile" wraps a library op."""
    return getattr(choice, "family", None) == "extern" and getattr(choice, "src_hash", "") is None


def overlap_for(mode: str, isolation: str, device_type: str) -> bool:
    """Whether stage 1 starts timing binaries while others still compile.

    "auto" overlaps only where the timing runs in an isolated worker on a GPU: there the compile
    threads share neither the timing process's interpreter nor the device clock it reads.  On CPU
    (or in-process) the compile threads would compete with the timed kernels for the same cores.

    Example:
        >>> overlap_for("auto", "subprocess", "cuda"), overlap_for("auto", "off", "cuda"), overlap_for("on", "off", "cpu")
        (True, False, True)
    """
    if mode == "auto":
        return isolation == "subprocess" and device_type == "cuda"
    return mode == "on"
