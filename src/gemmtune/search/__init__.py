"""Search strategies: each a `Strategy` with `prune(choices, options)` (nothing timed; default: keep
all) and `search(choices, measure, options) -> ranking`; `search.final` turns a ranking into the pick.

Each strategy owns its options type (`Strategy.options`, an `Options`: one frozen field per knob, with
its doc and default) and its effort presets (`Strategy.efforts`: effort -> knob values); it refuses
another strategy's options with a TypeError.  Budgets are
not a strategy's business: the `measure` a strategy gets (a `gemmtune.measure.bench.Bench`) answers
None past the tune's Budget of runs or seconds.  "default" and "budgeted" (`ALIASES`) name no search
of their own: the plan (`gemmtune.pipeline.plan`) resolves them to a registered strategy.
"""

from __future__ import annotations

from ..core.choices import Timing
from .base import (CostModel, Measure, Options, ProblemDims, Prune, Strategy, StrategyFn, keep_all, knob,
                   ranking)
from .exhaustive import ExhaustiveOptions, exhaustive
from .model_pruned import MODEL_PRUNED_EFFORTS, ModelPrunedOptions, model_prune, model_pruned, stage0
from .prescreen import PRESCREEN_EFFORTS, PrescreenOptions, first_configs, prescreen

Measured = Timing
"""The former name of a ranking's entry, kept for code written against it: a ranking is of `Timing`s."""

STRATEGIES: dict[str, Strategy] = {
    "exhaustive": Strategy("exhaustive", exhaustive, options=ExhaustiveOptions),
    "prescreen": Strategy("prescreen", prescreen, first_configs, PrescreenOptions, PRESCREEN_EFFORTS),
    "model_pruned": Strategy("model_pruned", prescreen, model_prune, ModelPrunedOptions, MODEL_PRUNED_EFFORTS),
}

ALIASES: dict[str, str] = {
    "default": "the default effort's strategy and options (today model_pruned, N=14, X=4; prescreen off CUDA)",
    "budgeted": "default, stopped after Settings.budget_runs benchmark runs (library kernels first)",
}
"""Strategy names `Settings.strategy` accepts beyond the registered ones, and what they resolve to."""


def for_device(name: str, device_type: str) -> str:
    """The strategy that runs when `name` is asked for on `device_type`.

    The cost model of model_pruned's stage 0 describes NVIDIA GPUs: on any other device it would
    prune on a wrong estimate, so there model_pruned is prescreen (and `Selection.strategy` says so).

    Example:
        >>> for_device("model_pruned", "cuda"), for_device("model_pruned", "cpu"), for_device("exhaustive", "cpu")
        ('model_pruned', 'prescreen', 'exhaustive')
    """
    return "prescreen" if name == "model_pruned" and device_type != "cuda" else name


__all__ = ["STRATEGIES", "ALIASES", "CostModel", "Measure", "Measured", "Options", "ProblemDims", "Prune",
           "Strategy", "StrategyFn", "for_device", "keep_all", "knob", "ranking", "exhaustive", "ExhaustiveOptions",
           "prescreen", "PrescreenOptions", "first_configs", "model_pruned", "model_prune", "ModelPrunedOptions",
           "stage0"]
