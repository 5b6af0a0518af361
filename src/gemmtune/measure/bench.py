"""Runs and records measurements for one problem: the `measure` a strategy gets.

Each choice is checked against the reference the first time it is measured; a
wrong or failing choice is recorded and never timed again.  A choice whose timing came from the store
(`known`) ranks without running, but is checked before the interleaved re-time runs it (`retime`),
and `check` gates a winner nothing has checked in this tune.  Where the checks
and timings run is the Bench's runner (gemmtune.measure.runners); what is
measured, the records, the run count and the budget (`gemmtune.measure.budget.Budget`: runs and
seconds) belong to the Bench.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Sequence

from ..core.choices import Choice, Timing, library_reference as reference
from ..core.errors import NoCandidatesError
from ..core.inputs import KernelInputs
from ..core.settings import CPU_CANNOT_WIN
from .budget import Budget
from .compile import CompileResult
from .runners import RunFailed, Runner

log = logging.getLogger("gemmtune")
Listener = Callable[..., None]


class Bench:
    """Measures choices through `runner` and keeps what it learns in `records`.

    `known`: timings recalled from the store, answered without running.  `runnable`: how many
    choices the search may measure (progress events and the report).  `budget`: past its runs
    (distinct choices asked for) a choice is answered None, as a failed one; past its deadline
    nothing more is timed except library kernels, the safety net of a cut-short search
    (`budget_exhausted` then says so).  `ki` may be None for a replay (`describe` and `device_type`
    then name the problem).  `check_recalled`: check recalled choices before re-timing them even
    without `check_correctness` (a shared store's); `on_wrong(choice, why)`: told of each recalled
    choice such a check finds wrong (the store drops it).

    Example:
        >>> import torch
        >>> from gemmtune.measure.compile import CompileResult
        >>> from gemmtune.measure.replay import ReplayRunner
        >>> from gemmtune.core.inputs import KernelInputs
        >>> ki = KernelInputs.from_tensors("mm", torch.randn(4, 3), torch.randn(3, 2))
        >>> fast, slow = Choice("fast", "h1"), Choice("slow", "h2")
        >>> bench = Bench(ki, ReplayRunner({fast.key: 1.0, slow.key: 2.0}), CompileResult(), runnable=2)
        >>> bench.measure([slow, fast], "final"), bench.runs
        ([2.0, 1.0], 2)
    """

    def __init__(self, ki: KernelInputs | None, runner: Runner, compiled: CompileResult, *,
                 known: Mapping[Choice, Timing] | None = None, check_correctness: bool = True,
                 listener: Listener | None = None, runnable: int = 0, budget: Budget | None = None,
                 describe: str = "", device_type: str = "cuda", check_recalled: bool = False,
                 on_wrong: Callable[[Choice, str], None] | None = None):
        self.runner, self.compiled = runner, compiled
        self.describe = ki.describe() if ki is not None else describe
        self.device_type = ki.device_type if ki is not None else device_type
        self.known = dict(known or {})
        self.check_correctness, self.runnable, self.budget = check_correctness, runnable, budget or Budget()
        self.asked: set[Choice] = set()  # distinct choices measured or answered (what a budget of runs counts)
        self.listener = listener or (lambda event, **info: None)
        self.records: dict[Choice, Timing] = {}
        self.runs = 0
        self.budget_exhausted = False
        self.seconds: dict[str, float] = {}
        self.last_s = 0.0  # seconds the last choice measured took (check and timing): what the next may take
        self.verified: set[Choice] = set()  # passed the correctness check in this tune
        self.check_recalled, self.on_wrong = check_recalled or check_correctness, on_wrong

    @property
    def isolation(self) -> str:
        """Where the candidates ran (Selection.isolation)."""
        return self.runner.isolation

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> "Bench":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the function strategies call -------------------------------------------------
    def __call__(self, choices: Sequence[Choice], stage: str) -> list[float | None]:
        """`measure`: a Bench is a strategy's `Measure`, whose `records` it may rank by."""
        return self.measure(choices, stage)

    def measure(self, choices: Sequence[Choice], stage: str) -> list[float | None]:
        """Times of `choices` (None: failed), in their order.  While binaries are still compiling
        (a CompileJob), the first ready choice in order goes next; nothing waits for a binary
        while another is ready."""
        t0 = time.perf_counter()
        out: dict[int, float | None] = {i: None for i, c in enumerate(choices) if not self._counted(c)}
        pending = [i for i in range(len(choices)) if i not in out]
        while pending:
            nxt = next((i for i in pending if self._ready(choices[i])), None)
            if nxt is None:
                self.compiled.wait_any([choices[i] for i in pending])
                continue
            pending.remove(nxt)
            out[nxt] = self._measure_one(choices[nxt], stage)
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0
        return [out[i] for i in range(len(choices))]

    def _counted(self, choice: Choice) -> bool:
        """Whether `choice` fits the budget of runs (counted now if new); past it, it is answered None."""
        if choice in self.asked:
            return True
        if not self.budget.within_runs(len(self.asked), 1):
            return False
        self.asked.add(choice)
        return True

    def _ready(self, choice: Choice) -> bool:
        return choice.is_extern or choice in self.records or choice in self.known or self.compiled.ready(choice)

    def _measure_one(self, choice: Choice, stage: str) -> float | None:
        prior = self.records.get(choice)
        if prior is None and choice in self.known:
            prior = self.records[choice] = self.known[choice]
        if prior is not None:  # timed already in this tune (or recalled): never twice
            return prior.ms if prior.status == "ok" else None
        if self._past_deadline(choice):
            self.budget_exhausted = True
            return None
        failed = None if choice.is_extern else self.compiled.failures.get(choice.binary_key)
        if failed is not None:  # a binary that failed while the search was running (CompileJob)
            if failed.startswith("BudgetExceeded"):
                self.budget_exhausted = True
                return None
            self.records[choice] = Timing(choice, None, "compile", "compile_failed", failed)
            return None
        t0 = time.perf_counter()
        record = self.records[choice] = self.runner.time(choice, stage, check=self.check_correctness)
        self.last_s = time.perf_counter() - t0
        if self.check_correctness and record.status == "ok":
            self.verified.add(choice)
        if record.status != "ok":
            log.warning("gemmtune: excluded %s %s: %s: %s", choice.name, choice.description,
                        record.status.replace("_", " "), record.detail)
            return None
        log.debug("gemmtune: %s %s: %.4f ms (%s)", choice.name, choice.description, record.ms, stage)
        self.runs += 1
        self.listener("benchmark", done=self.runs, total=self.runnable, choice=choice)
        return record.ms

    def _past_deadline(self, choice: Choice) -> bool:
        """A generated choice would end past the deadline (if it takes as long as the last one did)."""
        return self.budget.deadline is not None and not choice.is_extern and self.budget.out_of_time(self.last_s)

    def verify(self, choice: Choice) -> None:
        """Correctness only (a pinned choice is not timed); raises when it is wrong."""
        problem = self.runner.check(choice) if self.check_correctness else None
        if problem:
            raise NoCandidatesError(f"{self.describe}: the pinned choice {choice.key} gives a wrong result: {problem}")
        if self.check_correctness:
            self.verified.add(choice)
        known = self.known.get(choice)
        self.records[choice] = Timing(choice, known.ms if known else None, "pinned")

    # -- finalists ---------------------------------------------------------------------
    def retime(self, choices: Sequence[Choice], rounds: int) -> list[float]:
        """Re-time `choices` interleaved; their records take the new times.  On CPU only those that can
        still win are re-timed (`_worth_retiming`); the others keep their earlier timings.

        Where the runner cannot (its worker was lost), the finalists keep their earlier, separate
        timings.  A finalist whose timing came from the store is checked first (`check_recalled`): one
        found wrong is recorded so, left out, and its time is inf."""
        t0 = time.perf_counter()
        again = [c for c in self._worth_retiming(choices) if not self._wrong_recalled(c)]
        try:
            timed = self.runner.time_interleaved(again, rounds) if again else []
        except RunFailed as exc:
            log.warning("gemmtune: interleaved re-timing failed (%s); using the earlier timings", exc)
            again = list(choices)  # every finalist's earlier timing stands as its final one
            timed = [self._earlier(c) for c in again]
        self.seconds["finalist"] = time.perf_counter() - t0
        self.records.update(zip(again, timed))
        self.runs += len(again)
        return [self._ms(c) for c in choices]

    def second_opinion(self, choices: Sequence[Choice]) -> tuple[str, list[float]] | None:
        """(timer, ms per choice) from the runner's second, independent timer (`measure.second`), for
        the final's close call; None where it has none or cannot answer (the first timer's times stand)."""
        t0 = time.perf_counter()
        try:
            reading = self.runner.second_opinion(choices)
        except RuntimeError as exc:  # RunFailed, or the timer's own error: the first timer's decision stands
            log.warning("gemmtune: %s: the second timer failed (%s); the first timer's reading decides",
                        self.describe, exc)
            reading = None
        self.seconds["second_timer"] = time.perf_counter() - t0
        return reading

    # -- the gate on what the store answered -------------------------------------------------
    def recalled(self, choice: Choice) -> bool:
        """`choice`'s timing came from the store and nothing checked it in this tune."""
        return choice in self.known and choice not in self.verified

    def check(self, choice: Choice) -> str | None:
        """Run `choice` once against the reference: None when right (then it counts as checked), else
        why not (recorded as a wrong result)."""
        try:
            problem = self.runner.check(choice)
        except Exception as exc:  # a launch failure: not a correct kernel either
            problem = f"it failed to run: {type(exc).__name__}: {str(exc).strip()[:200]}"
        if problem:
            self.records[choice] = Timing(choice, None, "check", "wrong_result", problem)
            return problem
        self.verified.add(choice)
        return None

    def distrust(self) -> None:
        """Forget every timing the store answered and nothing confirmed: what follows measures afresh."""
        self.known = {}
        self.records = {c: t for c, t in self.records.items() if t.stage != "store"}

    def _wrong_recalled(self, choice: Choice) -> bool:
        """A recalled finalist, checked now: wrong (recorded, and the store told) or right."""
        if not self.check_recalled or not self.recalled(choice):
            return False
        problem = self.check(choice)
        if problem:
            log.warning("gemmtune: excluded %s %s (its timing came from the store): wrong result: %s",
                        choice.name, choice.description, problem)
            if self.on_wrong is not None:
                self.on_wrong(choice, problem)
        return problem is not None

    def _earlier(self, choice: Choice) -> Timing:
        """`choice`'s timing as a finalist: its record's times (ms inf where it has none)."""
        t = self.records.get(choice)
        if t is None:
            return Timing(choice, float("inf"), "finalist")
        ms = t.ms if t.ms is not None else float("inf")
        return Timing(choice, ms, "finalist", gpu_ms=t.gpu_ms, host_ms=t.host_ms, spread=t.spread)

    def _ms(self, choice: Choice) -> float:
        """`choice`'s time so far (inf where it has none)."""
        return self._earlier(choice).ms or 0.0

    def _worth_retiming(self, choices: Sequence[Choice]) -> list[Choice]:
        """On CPU, the finalists whose separate timing is within `CPU_CANNOT_WIN` of the fastest one's:
        a finalist twice as slow cannot win and keeps its earlier timing (a 30 ms numba tile against a
        12 ms BLAS on 1024^3 would cost the re-time a third of its time), with the best library kernel
        whenever a generated kernel is among them (a cheap stage-1 time on a loaded machine can read
        10x fast: it must be confirmed against the library kernel), and none when a library kernel
        is left alone: its win is clear.  Elsewhere every finalist."""
        if self.device_type != "cpu":
            return list(choices)
        fastest = min(self._ms(c) for c in choices)
        again = [c for c in choices if self._ms(c) <= CPU_CANNOT_WIN * fastest]
        library = reference(sorted(choices, key=self._ms))
        if library is not None and library not in again and any(c.family != library.family for c in again):
            again.append(library)  # another kernel wins only re-timed against the library kernel (torch's op)
        return again if len(again) > 1 else []  # a lone library kernel is compared with nothing: no re-time
