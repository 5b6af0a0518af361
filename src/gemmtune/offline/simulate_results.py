"""What `gemmtune simulate` reports: per shape, per strategy, and the whole simulation."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ShapeResult:
    """One strategy on one shape: `winner` is the final pick (`gemmtune.search.final`), `regret_pct` its
    recorded time against the shape's best; runs and compiles count the search, not the final re-time."""

    shape: tuple[int, int, int]
    name: str
    winner: str | None
    regret_pct: float  # inf: nothing correct was timed
    benchmark_runs: int
    exhaustive_runs: int
    compiles: int
    est_tuning_s: float
    problem: str = ""  # the shape's problem key (`ReplayShape.problem`)


@dataclass(frozen=True)
class StrategyResult:
    """One strategy over every shape: regret (max, median) and the work summed."""

    name: str
    per_shape: tuple[ShapeResult, ...]

    @property
    def max_regret_pct(self) -> float:
        return max(r.regret_pct for r in self.per_shape)

    @property
    def median_regret_pct(self) -> float:
        return statistics.median(r.regret_pct for r in self.per_shape)

    @property
    def benchmark_runs(self) -> int:
        return sum(r.benchmark_runs for r in self.per_shape)

    @property
    def work_fraction(self) -> float:
        return self.benchmark_runs / max(1, sum(r.exhaustive_runs for r in self.per_shape))

    @property
    def compiles(self) -> int:
        return sum(r.compiles for r in self.per_shape)

    @property
    def est_tuning_s(self) -> float:
        return sum(r.est_tuning_s for r in self.per_shape)


@dataclass(frozen=True)
class SimulationReport:
    """Every simulated strategy, by name.

    Example:
        >>> r = ShapeResult((8, 8, 8), "s", "lib", 0.0, 1, 2, 0, 0.1)
        >>> rep = SimulationReport((StrategyResult("x", (r,)),))
        >>> rep["x"].work_fraction, rep.to_json()["strategies"][0]["per_shape"][0]["winner"]
        (0.5, 'lib')
    """

    strategies: tuple[StrategyResult, ...]

    def __getitem__(self, name: str) -> StrategyResult:
        return next(s for s in self.strategies if s.name == name)

    def to_json(self) -> dict[str, Any]:
        """Plain data; an infinite regret (nothing timed) is written as null."""
        fin = lambda x: x if math.isfinite(x) else None  # noqa: E731
        return {"strategies": [
            {"name": s.name, "max_regret_pct": fin(s.max_regret_pct), "median_regret_pct": fin(s.median_regret_pct),
             "work_fraction": s.work_fraction, "benchmark_runs": s.benchmark_runs, "compiles": s.compiles,
             "est_tuning_s": s.est_tuning_s,
             "per_shape": [{"shape": list(r.shape), "name": r.name, "problem": r.problem, "winner": r.winner,
                            "regret_pct": fin(r.regret_pct), "benchmark_runs": r.benchmark_runs} for r in s.per_shape]}
            for s in self.strategies]}
