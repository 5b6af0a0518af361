"""Search strategies: plain functions `(choices, measure, options) -> ranking`."""

from __future__ import annotations

from .base import Measure, Measured, StrategyOptions, ranking
from .exhaustive import exhaustive
from .prescreen import prescreen

STRATEGIES = {"exhaustive": exhaustive, "prescreen": prescreen}

__all__ = ["STRATEGIES", "Measure", "Measured", "StrategyOptions", "ranking", "exhaustive", "prescreen"]
