"""What every search strategy receives and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ..core.choices import Choice

Measure = Callable[[Sequence[Choice], str], list["float | None"]]
"""`measure(choices, stage) -> ms per choice` (None: failed or wrong).  Every call is recorded."""


@dataclass(frozen=True)
class Measured:
    choice: Choice
    ms: float | None
    stage: str


class ProblemDims(NamedTuple):
    """The problem a model-based strategy estimates for: C[M,N] = A[M,K] @ B[K,N], `batch` times."""

    M: int
    N: int
    K: int
    batch: int = 1
    dtype_bytes: int = 2


CostModel = Callable[..., float]
"""`model(config, M, N, K, dtype_bytes, batch) -> estimated ms` (inf: cannot run); see gemmtune.search.cost_model."""


@dataclass(frozen=True)
class StrategyOptions:
    """Knobs a strategy may read.

    `stage1` maps a template uid to the runtime params used in prescreening's
    first stage (e.g. {"triton_mm": {"swizzle": 8}}).
    `stage0_n`: model_pruned keeps the N binaries the cost model ranks best (None: no pruning);
    `model` replaces the cost model (default `gemmtune.search.cost_model.estimate_ms`); `problem` gives it
    the problem's dimensions.  `budget_runs`: at most this many benchmark runs for any
    registered strategy (None: unlimited); `budget_inner`: what the `budgeted` entry wraps.
    """

    top_x: int = 5
    stage1: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    stage0_n: int | None = None
    model: CostModel | None = None
    problem: ProblemDims | None = None
    budget_runs: int | None = None
    budget_inner: str = "default"


Strategy = Callable[[Sequence[Choice], Measure, StrategyOptions], list[Measured]]
"""`strategy(choices, measure, options) -> ranking` (every measured choice, fastest first)."""


def ranking(measured: Sequence[Measured]) -> list[Measured]:
    """Successful measurements, fastest first; failures last."""
    ok = sorted((m for m in measured if m.ms is not None), key=lambda m: m.ms)
    return ok + [m for m in measured if m.ms is None]
