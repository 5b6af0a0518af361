"""Parallel precompile with a per-choice timeout.

Choices that share a binary (same template + config) compile once.  A binary
that fails to compile, overflows the device's resources or exceeds the timeout
is dropped and logged; the remaining choices go on.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch

from .choices import Choice
from .inputs import KernelInputs
from .templates.base import Launcher, Template

log = logging.getLogger("gemmtune")


@dataclass
class CompileResult:
    launchers: dict[tuple, Launcher] = field(default_factory=dict)
    failures: dict[tuple, str] = field(default_factory=dict)
    seconds: float = 0.0
    binary_seconds: dict[tuple, float] = field(default_factory=dict)  # compile time of each binary

    def launcher(self, choice: Choice) -> Launcher | None:
        return self.launchers.get(choice.binary_key)


def precompile(choices: Sequence[Choice], templates: Mapping[str, Template], ki: KernelInputs,
               example: Sequence[torch.Tensor], *, timeout_s: float, workers: int = 0,
               on_done: Callable[[int, int], None] | None = None, deadline: float | None = None) -> CompileResult:
    """Compile every distinct binary among `choices` in a thread pool.

    `on_done(done, total)` is called after each binary (for progress bars).  Past
    `deadline` (a `time.perf_counter()` value) the binaries still pending are
    abandoned and recorded as failures ("budget").
    """
    start = time.perf_counter()
    result = CompileResult()
    unique: dict[tuple, Choice] = {}
    for c in choices:
        unique.setdefault(c.binary_key, c)
    workers = workers or min(32, os.cpu_count() or 1)
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(unique))), thread_name_prefix="gemmtune-compile")
    started: dict[tuple, float] = {}  # binary key -> when its compile began
    keys: dict[Future, tuple] = {}

    def build(c: Choice) -> Launcher:
        t0 = started[c.binary_key] = time.perf_counter()
        launcher = templates[c.template_uid].compile(c, ki, example)
        result.binary_seconds[c.binary_key] = time.perf_counter() - t0
        return launcher

    for key, c in unique.items():
        keys[pool.submit(build, c)] = key
    pending = set(keys)
    done_count = 0
    try:
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for fut in done:
                key = keys[fut]
                exc = fut.exception()
                if exc is None:
                    result.launchers[key] = fut.result()
                else:
                    result.failures[key] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                    log.warning("gemmtune: dropped %s: compile failed: %s", unique[key].name, result.failures[key])
                done_count += 1
                if on_done:
                    on_done(done_count, len(unique))
            now = time.perf_counter()
            if deadline is not None and now > deadline and pending:
                for fut in list(pending):
                    fut.cancel()
                    result.failures[keys[fut]] = "BudgetExceeded: tuning time budget spent before this compiled"
                pending = set()
                break
            for fut in list(pending):
                t0 = started.get(keys[fut])
                if t0 is not None and now - t0 > timeout_s:
                    key = keys[fut]
                    pending.discard(fut)
                    fut.cancel()
                    result.failures[key] = f"TimeoutError: compile exceeded {timeout_s:g} s"
                    log.warning("gemmtune: dropped %s: %s", unique[key].name, result.failures[key])
                    done_count += 1
                    if on_done:
                        on_done(done_count, len(unique))
    finally:
        # A timed-out compile cannot be interrupted; it finishes in the background, unused.
        pool.shutdown(wait=False, cancel_futures=True)
    result.seconds = time.perf_counter() - start
    return result
