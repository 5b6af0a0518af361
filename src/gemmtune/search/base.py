"""What every search strategy receives and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ..core.choices import Choice, Timing

Measure = Callable[[Sequence[Choice], str], list["float | None"]]
"""`measure(choices, stage) -> ms per choice` (None: failed or wrong).  Every call is recorded."""


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
    """The options a strategy reads, as one typed value; each strategy declares which it reads, with
    their docs and defaults (`Strategy.knobs`), and the plan (`gemmtune.pipeline.plan`) fills them
    from the effort preset and the settings.

    `stage1` maps a template uid to the runtime params used in prescreening's
    first stage (e.g. {"triton_mm": {"swizzle": 8}}).
    `stage0_n`: model_pruned keeps the N binaries the cost model ranks best (None: no pruning);
    `model` replaces the cost model (default `gemmtune.search.cost_model.estimate_ms`); `problem` gives it
    the problem's dimensions.
    """

    top_x: int = 5
    stage1: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    stage0_n: int | None = None
    model: CostModel | None = None
    problem: ProblemDims | None = None
    configs_per_template: int | None = None
    stage2_within: float | None = None


Knobs = Mapping[str, "tuple[str, Any]"]
"""A strategy's options: name -> (doc, default)."""


def knobs_of(*names: str) -> dict[str, tuple[str, Any]]:
    """The named StrategyOptions fields as knobs: each with its doc and its default.

    Example:
        >>> knobs_of("top_x")["top_x"][1]
        5
    """
    docs = {"top_x": "prescreen: binaries kept after stage 1 for stage 2",
            "stage1": "prescreen: each template's stage-1 runtime values, by uid",
            "stage0_n": "model_pruned: binaries the cost model keeps before anything compiles (None: all)",
            "model": "model_pruned: the cost model (None: gemmtune.search.cost_model.estimate_ms)",
            "problem": "model_pruned: the problem's dimensions the cost model estimates for",
            "configs_per_template": "prescreen's prune: each template's first N binaries (None: all)",
            "stage2_within": "prescreen: stage 2 only for binaries within this factor of the fastest"}
    defaults = vars(StrategyOptions())
    return {n: (docs[n], defaults[n]) for n in names}


StrategyFn = Callable[[Sequence[Choice], Measure, StrategyOptions], list[Timing]]
"""`search(choices, measure, options) -> ranking`: a Timing of every measured choice (ms None: failed),
fastest first."""

Prune = Callable[[Sequence[Choice], StrategyOptions], list[Choice]]
"""`prune(choices, options) -> the choices worth compiling` (nothing is timed)."""


def keep_all(choices: Sequence[Choice], options: StrategyOptions) -> list[Choice]:
    """The default `prune`: every choice is compiled and searched."""
    return list(choices)


@dataclass(frozen=True)
class Strategy:
    """A search strategy in two steps.  `prune` drops choices before anything is compiled or timed
    (model_pruned: the cost model's stage 0); `search` times what is left and ranks it.  The engine
    calls `prune` before compiling, so a pruned binary is never built, and then `search` on what
    compiled; calling the strategy itself does both, for offline replays and tests.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> def time_all(cs, measure, options):
        ...     return ranking([Timing(c, ms, "final") for c, ms in zip(cs, measure(cs, "final"))])
        >>> first = Strategy("first", time_all, prune=lambda cs, options: list(cs[:1]))
        >>> cs = [Choice("a", None), Choice("b", None)]
        >>> [c.template_uid for c in first.prune(cs, StrategyOptions())]
        ['a']
        >>> [m.choice.template_uid for m in first(cs, lambda cc, st: [1.0] * len(cc), StrategyOptions())]
        ['a']
    """

    name: str
    search: StrategyFn
    prune: Prune = keep_all
    knobs: Knobs = field(default_factory=dict)  # the options it reads: name -> (doc, default)

    def __call__(self, choices: Sequence[Choice], measure: Measure, options: StrategyOptions) -> list[Timing]:
        return self.search(self.prune(choices, options), measure, options)


def ranking(measured: Sequence[Timing]) -> list[Timing]:
    """Successful timings, fastest first; failures (ms None) last."""
    ok = sorted((m for m in measured if m.ms is not None), key=lambda m: m.ms or 0.0)
    return ok + [m for m in measured if m.ms is None]
