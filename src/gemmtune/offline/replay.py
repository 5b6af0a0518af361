"""Replay recorded timings: run any strategy, and tune's final decision, offline against a sweep.

A replay runs tune's own pipeline (`gemmtune.pipeline.steps.search`: prune, Bench, search, final)
with the recorded times standing in for the device (`ReplayRunner`) and nothing to compile
(`ReplayCompiled`).  Reads gemmtune datasets and the reference sweep format (see dataset.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..core.choices import Choice, Timing
from ..core.errors import NoCandidatesError
from ..measure.replay import RecordedTime, ReplayCompiled, ReplayRunner
from ..pipeline.plan import replay_plan
from ..pipeline.steps import Recalled, search
from ..search import Options
from ..search.final import FinalRule
from .dataset import ReplayShape, load_dataset


@dataclass(frozen=True)
class ReplayOutcome:
    shape: tuple[int, int, int]
    winner: Choice
    winner_ms: float
    best_ms: float
    benchmark_runs: int

    @property
    def regret_pct(self) -> float:
        """How much slower the strategy's pick is than the exhaustive best, in %."""
        return 100.0 * (self.winner_ms / self.best_ms - 1.0)


def load_sweep(path: str | Path) -> list[ReplayShape]:
    """Replay shapes from a gemmtune dataset or a reference sweep."""
    return load_dataset(path)[1]


@dataclass(frozen=True)
class ReplayDecision:
    """A strategy's whole decision on recorded timings: its ranking, every choice it timed (in
    order; compiles follow from these), and the final pick (None: nothing correct was timed)."""

    ranked: list[Timing]
    timed: list[Choice]
    pick: Choice | None


def decide(shape: ReplayShape, strategy: str, options: Options, rule: FinalRule | None = None,
           runs: int | None = None, recorded: Mapping[str, RecordedTime] | None = None) -> ReplayDecision:
    """Run `strategy` (prune, then search) with recorded timings standing in for the GPU, then the
    final step of `tune` (`gemmtune.search.final`, `rule` default: tune's), under a budget of `runs`
    (None: none).  The recorded times stand in for the interleaved re-time too, so the final changes
    the pick only through its rules: the library margin (only the costs are handed on, so the GPU-time
    guard is idle).  `recorded` (choice key -> reading) answers instead of the shape's costs: readings
    with GPU and host times let the final's rules that read them act.

    Example:
        >>> from gemmtune.search import ExhaustiveOptions
        >>> lib, gen = Choice("aten_mm", None), Choice("triton_mm", "h", family="triton")
        >>> d = decide(ReplayShape((8, 8, 8), {lib: 1.0, gen: 0.995}), "exhaustive", ExhaustiveOptions())
        >>> d.ranked[0].choice.template_uid, d.pick.template_uid  # 0.5% is within the library margin
        ('triton_mm', 'aten_mm')
    """
    runner = ReplayRunner(recorded if recorded is not None
                          else {c.key: ms for c, ms in shape.times.items() if ms is not None})
    try:
        outcome = search(replay_plan(strategy, options, rule, runs), shape.choices, Recalled({}, list(shape.choices)),
                         lambda todo, overlap: ReplayCompiled(todo), lambda: runner,
                         describe=shape.name or "x".join(map(str, shape.shape)), device_type="cuda")
    except NoCandidatesError:  # nothing timed ran correctly
        return ReplayDecision([], list(dict.fromkeys(runner.asked)), None)
    return ReplayDecision(outcome.ranked, list(outcome.bench.records), outcome.decision.choice)


def replay(shape: ReplayShape, strategy: str, options: Options, rule: FinalRule | None = None,
           runs: int | None = None) -> ReplayOutcome:
    """Run `strategy` and tune's final step with recorded timings standing in for the GPU (see `decide`).

    Example:
        >>> from gemmtune.search import ExhaustiveOptions
        >>> lib, gen = Choice("aten_mm", None), Choice("triton_mm", "h", family="triton")
        >>> out = replay(ReplayShape((8, 8, 8), {lib: 1.0, gen: 0.9}), "exhaustive", ExhaustiveOptions())
        >>> out.winner.template_uid, round(out.regret_pct, 6), out.benchmark_runs
        ('triton_mm', 0.0, 2)
    """
    d = decide(shape, strategy, options, rule, runs)
    if d.pick is None:
        raise NoCandidatesError(f"{shape.name or shape.shape}: {strategy} timed nothing that ran correctly")
    return ReplayOutcome(shape.shape, d.pick, shape.times[d.pick], shape.best_ms, len(d.timed))
