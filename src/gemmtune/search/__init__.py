"""Search strategies: plain functions `(choices, measure, options) -> ranking`.

Every registered strategy honours `options.budget_runs` (see budgeted.py).
"""

from __future__ import annotations

from .base import CostModel, Measure, Measured, ProblemDims, Strategy, StrategyOptions, ranking
from .budgeted import BudgetedMeasure, budgeted, budgeted_entry, honour_budget
from .default import default, default_options
from .exhaustive import exhaustive
from .model_pruned import model_pruned
from .prescreen import prescreen

STRATEGIES: dict[str, Strategy] = {
    "exhaustive": honour_budget(exhaustive),
    "prescreen": honour_budget(prescreen),
    "model_pruned": honour_budget(model_pruned),
    "default": honour_budget(default),
    "budgeted": budgeted_entry,
}

__all__ = ["STRATEGIES", "CostModel", "Measure", "Measured", "ProblemDims", "Strategy", "StrategyOptions",
           "ranking", "exhaustive", "prescreen", "model_pruned", "default", "default_options", "budgeted",
           "budgeted_entry", "honour_budget", "BudgetedMeasure"]
