"""Search strategies: each a `Strategy` with `prune(choices, options)` (nothing timed; default: keep
all) and `search(choices, measure, options) -> ranking`; `search.final` turns a ranking into the pick.

Every registered strategy honours `options.budget_runs` (see budgeted.py).
"""

from __future__ import annotations

from .base import (CostModel, Measure, Measured, ProblemDims, Prune, Strategy, StrategyFn, StrategyOptions, keep_all,
                   ranking)
from .budgeted import BudgetedMeasure, budgeted, budgeted_entry, budgeted_prune, budgeted_search, honour_budget
from .default import default, default_options, default_prune, default_search
from .exhaustive import exhaustive
from .model_pruned import model_pruned, stage0
from .prescreen import first_configs, prescreen

STRATEGIES: dict[str, Strategy] = {
    "exhaustive": Strategy("exhaustive", honour_budget(exhaustive)),
    "prescreen": Strategy("prescreen", honour_budget(prescreen), prune=first_configs),
    "model_pruned": Strategy("model_pruned", honour_budget(prescreen), prune=stage0),
    "default": Strategy("default", honour_budget(default_search), prune=default_prune),
    "budgeted": Strategy("budgeted", budgeted_search, prune=budgeted_prune),
}


def for_device(name: str, device_type: str) -> str:
    """The registered strategy that runs when `name` is asked for on `device_type`.

    The cost model of model_pruned's stage 0 describes NVIDIA GPUs: on any other device it would
    prune on a wrong estimate, so there model_pruned is prescreen (and `Selection.strategy` says so).

    Example:
        >>> for_device("model_pruned", "cuda"), for_device("model_pruned", "cpu"), for_device("exhaustive", "cpu")
        ('model_pruned', 'prescreen', 'exhaustive')
    """
    return "prescreen" if name == "model_pruned" and device_type != "cuda" else name


__all__ = ["STRATEGIES", "CostModel", "Measure", "Measured", "ProblemDims", "Prune", "Strategy", "StrategyFn",
           "StrategyOptions", "for_device", "keep_all", "ranking", "exhaustive", "prescreen", "first_configs", "model_pruned", "stage0",
           "default", "default_options", "default_prune", "default_search", "budgeted", "budgeted_entry",
           "budgeted_prune", "budgeted_search", "honour_budget", "BudgetedMeasure"]
