"""Replay recorded timings: run any strategy offline against a sweep.

Reads gemmtune datasets and the reference sweep format (see dataset.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..core.choices import Choice
from .dataset import ReplayShape, load_dataset
from ..search import STRATEGIES, StrategyOptions


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


def replay(shape: ReplayShape, strategy: str, options: StrategyOptions) -> ReplayOutcome:
    """Run `strategy` with recorded timings standing in for the GPU."""
    runs = 0

    def measure(choices: Sequence[Choice], stage: str) -> list[float | None]:
        nonlocal runs
        runs += len(choices)
        return [shape.times.get(c) for c in choices]

    ranked = STRATEGIES[strategy](shape.choices, measure, options)
    top = ranked[0]
    return ReplayOutcome(shape.shape, top.choice, shape.times[top.choice], shape.best_ms, runs)
