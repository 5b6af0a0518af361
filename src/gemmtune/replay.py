"""Replay recorded timings: run any strategy offline against a sweep.

Reads the reference sweep format (shared/data/README.md): one JSON record per
shape with `shape` [M, K, N], `cublas_ms` and `results` =
[{cfg: [BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps], ms: {swizzle: ms}}].
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .choices import Choice, as_params
from .strategies import STRATEGIES, StrategyOptions

REPLAY_TEMPLATE = "triton_mm"
REPLAY_HASH = "replay"


@dataclass(frozen=True)
class ReplayShape:
    shape: tuple[int, int, int]
    times: dict[Choice, float]  # every recorded choice -> ms

    @property
    def choices(self) -> list[Choice]:
        return list(self.times)

    @property
    def best_ms(self) -> float:
        return min(self.times.values())


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
    shapes = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        times: dict[Choice, float] = {}
        for r in rec["results"]:
            bm, bn, bk, stages, warps = r["cfg"]
            cfg = as_params(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps))
            for sw, ms in r["ms"].items():
                if ms is not None:
                    times[Choice(REPLAY_TEMPLATE, REPLAY_HASH, cfg, as_params({"swizzle": int(sw)}), family="triton")] = ms
        cublas = rec.get("cublas_ms")
        if cublas:
            times[Choice("aten_mm", None)] = statistics.median(cublas) if isinstance(cublas, list) else cublas
        shapes.append(ReplayShape(tuple(rec["shape"]), times))
    return shapes


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
