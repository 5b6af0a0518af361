"""Runs and records measurements for one problem: the `measure` a strategy gets.

Each choice is checked against the reference the first time it is measured
(output poisoned with NaN first, so unwritten elements show); a wrong or
failing choice is recorded and never timed again.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import torch

from ..core.choices import Choice, Timing
from .compile import CompileResult
from .correctness import check, reference
from ..core.inputs import KernelInputs
from .timers import Timer

log = logging.getLogger("gemmtune")
Listener = Callable[..., None]


class Bench:
    def __init__(self, ki: KernelInputs, tensors: Sequence[torch.Tensor], compiled: CompileResult,
                 timer: Timer, *, known: dict[Choice, Timing] | None = None, check_correctness: bool = True,
                 listener: Listener | None = None, total_hint: int = 0,
                 out_factory: Callable[[], torch.Tensor] | None = None,
                 ensure: Callable[[Choice], Any] | None = None):
        self.ki, self.tensors, self.compiled, self.timer = ki, tuple(tensors), compiled, timer
        self.known = known or {}  # timings recalled from the store: answered without running
        self.deadline: float | None = None  # perf_counter() after which nothing more is timed (--budget-s)
        self.budget_exhausted = False
        self.out_factory = out_factory
        self.ensure = ensure or compiled.launcher
        self.check_correctness = check_correctness
        self.listener = listener or (lambda event, **info: None)
        self.out: torch.Tensor | None = None
        self._ref: torch.Tensor | None = None
        self.records: dict[Choice, Timing] = {}
        self.runs = 0
        self.runnable = 0  # how many choices the search may measure (set by the engine)
        self.seconds: dict[str, float] = {}
        self.total_hint = total_hint

    # -- the function strategies call -------------------------------------------------
    def measure(self, choices: Sequence[Choice], stage: str) -> list[float | None]:
        """Times of `choices` (None: failed), in their order.  While binaries are still compiling
        (a CompileJob), the first ready choice in order goes next; nothing waits for a binary
        while another is ready."""
        t0 = time.perf_counter()
        out: dict[int, float | None] = {}
        pending = list(range(len(choices)))
        while pending:
            nxt = next((i for i in pending if self._ready(choices[i])), None)
            if nxt is None:
                self.compiled.wait_any([choices[i] for i in pending])
                continue
            pending.remove(nxt)
            out[nxt] = self._measure_one(choices[nxt], stage)
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0
        return [out[i] for i in range(len(choices))]

    def _ready(self, choice: Choice) -> bool:
        return choice.is_extern or choice in self.records or choice in self.known or self.compiled.ready(choice)

    def _fn(self, choice: Choice) -> Callable[[], Any]:
        launch = self.ensure(choice)
        rt, tensors, out = choice.runtime_dict, self.tensors, self._out(choice)
        return lambda: launch(tensors, out, **rt)

    def _out(self, choice: Choice) -> torch.Tensor:
        if self.out is None:
            self.out = self.out_factory() if self.out_factory else choice.layout.fix().empty()
        return self.out

    def _measure_one(self, choice: Choice, stage: str) -> float | None:
        prior = self.records.get(choice)
        if prior is None and choice in self.known:
            prior = self.records[choice] = self.known[choice]
            return prior.ms if prior.status == "ok" else None
        if prior is not None and prior.status != "ok":
            return None
        if prior is not None:
            return prior.ms  # timed already in this tune (or recalled): never twice
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.budget_exhausted = True
            return None
        failed = None if choice.is_extern else self.compiled.failures.get(choice.binary_key)
        if failed is not None:  # a binary that failed while the search was running (CompileJob)
            if failed.startswith("BudgetExceeded"):
                self.budget_exhausted = True
                return None
            self.records[choice] = Timing(choice, None, "compile", "compile_failed", failed)
            return None
        record = self.run_one(choice, stage)
        self.records[choice] = record
        if record.status != "ok":
            log.warning("gemmtune: excluded %s %s: %s: %s", choice.name, choice.description,
                        record.status.replace("_", " "), record.detail)
            return None
        self.runs += 1
        self.listener("benchmark", done=self.runs, total=self.total_hint, choice=choice)
        return record.ms

    def run_one(self, choice: Choice, stage: str) -> Timing:
        """Check (first time) and time one choice here, in this process."""
        try:
            fn = self._fn(choice)
            if self.check_correctness:
                problem = self._check(choice, fn)
                if problem:
                    return Timing(choice, None, stage, "wrong_result", problem)
            ms = self.timer.time(fn)
        except Exception as exc:  # a launch failure excludes the choice, not the tuning
            return Timing(choice, None, stage, "run_failed", f"{type(exc).__name__}: {str(exc).strip()[:200]}")
        gpu, host = getattr(self.timer, "last", (None, None))
        return Timing(choice, ms, stage, gpu_ms=gpu, host_ms=host)

    def verify(self, choice: Choice) -> None:
        """Correctness only (a pinned choice is not timed); raises when it is wrong."""
        from ..core.errors import NoCandidatesError

        problem = self.check_one(choice) if self.check_correctness else None
        if problem:
            raise NoCandidatesError(f"{self.ki.describe()}: the pinned choice {choice.key} gives a wrong result: {problem}")
        known = self.known.get(choice)
        self.records[choice] = Timing(choice, known.ms if known else None, "pinned")

    def check_one(self, choice: Choice) -> str | None:
        return self._check(choice, self._fn(choice))

    def _check(self, choice: Choice, fn: Callable[[], Any]) -> str | None:
        if self._ref is None:
            self._ref = reference(self.ki, self.tensors)
        out = self._out(choice)
        out.fill_(float("nan"))
        fn()
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        return check(self.ki, out, self._ref)

    # -- finalists ---------------------------------------------------------------------
    def retime(self, choices: Sequence[Choice], rounds: int) -> list[float]:
        """Re-time `choices` interleaved; their records take the new times."""
        t0 = time.perf_counter()
        times, split = self.time_interleaved(choices, rounds)
        self.seconds["finalist"] = time.perf_counter() - t0
        for c, ms, (gpu, host) in zip(choices, times, split):
            self.records[c] = Timing(c, ms, "finalist", gpu_ms=gpu, host_ms=host)
        self.runs += len(choices)
        return times

    def time_interleaved(self, choices: Sequence[Choice], rounds: int) -> tuple[list[float], list[tuple]]:
        times = self.timer.time_interleaved([self._fn(c) for c in choices], rounds)
        return times, getattr(self.timer, "last_all", None) or [(None, None)] * len(choices)
