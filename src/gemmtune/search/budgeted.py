"""Budgets: stop any strategy after a fixed number of benchmark runs.

The wrapper hands the strategy a `measure` that times at most `max_runs` choices in all
and answers None (as for a failed choice) once the budget is spent; the ranking is then
the best found so far.  Library kernels are timed first, inside the budget: they are the
safety net that keeps a cut-short search from doing worse than the library.  A choice is
never timed twice: repeated requests are answered from what was measured.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Sequence

from ..core.choices import Choice
from .base import Measure, Measured, Strategy, StrategyFn, StrategyOptions, ranking


class BudgetedMeasure:
    """A `measure` that times at most `max_runs` distinct choices (`runs` says how many it did).

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> m = BudgetedMeasure(lambda cs, st: [1.0] * len(cs), 2)
        >>> m([Choice("a", None), Choice("b", None), Choice("c", None)], "final"), m.runs
        ([1.0, 1.0, None], 2)
    """

    def __init__(self, measure: Measure, max_runs: int):
        if max_runs < 0:
            raise ValueError(f"budget: max_runs must be >= 0, got {max_runs}")
        self.measure, self.max_runs, self.runs = measure, max_runs, 0
        self.known: dict[Choice, Measured] = {}

    def __call__(self, choices: Sequence[Choice], stage: str) -> list[float | None]:
        todo: list[Choice] = []
        for c in choices:
            if c not in self.known and c not in todo and self.runs + len(todo) < self.max_runs:
                todo.append(c)
        if todo:
            for c, ms in zip(todo, self.measure(todo, stage)):
                self.known[c] = Measured(c, ms, stage)
            self.runs += len(todo)
        return [self.known[c].ms if c in self.known else None for c in choices]


def budgeted(inner: str | StrategyFn = "default", max_runs: int | None = None) -> StrategyFn:
    """`inner` (a registered name, a Strategy or a search function) stopped after `max_runs` benchmark runs.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> cs = [Choice("lib", None)] + [Choice("t", "h", (("B", b),), family="t") for b in range(5)]
        >>> seen = []
        >>> out = budgeted("exhaustive", 3)(cs, lambda cc, st: seen.extend(cc) or [1.0] * len(cc), StrategyOptions())
        >>> len(seen), seen[0].template_uid, sum(m.ms is not None for m in out)
        (3, 'lib', 3)
    """
    fn = _resolve(inner) if isinstance(inner, str) else inner
    if max_runs is None:
        return fn

    def run(choices: Sequence[Choice], measure: Measure, options: StrategyOptions) -> list[Measured]:
        bm = BudgetedMeasure(measure, max_runs)
        externs = [c for c in choices if c.is_extern]
        if externs:
            bm(externs, "final")  # the safety net is timed before any template
        ranked = fn(choices, bm, replace(options, budget_runs=None))
        listed = {m.choice for m in ranked}
        extra = [m for c, m in bm.known.items() if c not in listed]
        return ranking(list(ranked) + extra)

    run.__name__ = f"budgeted_{getattr(fn, '__name__', getattr(fn, 'name', 'strategy'))}_{max_runs}"
    return run


def budgeted_entry(choices: Sequence[Choice], measure: Measure, options: StrategyOptions) -> list[Measured]:
    """The registered `budgeted` strategy as one call: `options.budget_inner`'s prune, then its
    search under `options.budget_runs`.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> cs = [Choice("a", None), Choice("b", None)]
        >>> opts = StrategyOptions(budget_runs=1, budget_inner="exhaustive")
        >>> [m.ms for m in budgeted_entry(cs, lambda cc, st: [1.0] * len(cc), opts)]
        [1.0, None]
    """
    return budgeted_search(budgeted_prune(choices, options), measure, options)


def budgeted_prune(choices: Sequence[Choice], options: StrategyOptions) -> list[Choice]:
    """What `options.budget_inner` prunes (nothing is timed, so the budget does not count it)."""
    return _inner(options).prune(choices, options)


def budgeted_search(choices: Sequence[Choice], measure: Measure, options: StrategyOptions) -> list[Measured]:
    """`options.budget_inner`'s search (no prune: the caller pruned) under `options.budget_runs`."""
    return budgeted(_inner(options).search, options.budget_runs)(choices, measure, options)


def _inner(options: StrategyOptions) -> Strategy:
    if options.budget_inner == "budgeted":
        raise ValueError("budgeted: budget_inner cannot be 'budgeted' itself")
    return _resolve(options.budget_inner)


def honour_budget(fn: StrategyFn) -> StrategyFn:
    """`fn`, stopped after `options.budget_runs` runs when that is set (the registry wraps every strategy)."""

    @functools.wraps(fn)
    def run(choices: Sequence[Choice], measure: Measure, options: StrategyOptions) -> list[Measured]:
        if options.budget_runs is None:
            return fn(choices, measure, options)
        return budgeted(fn, options.budget_runs)(choices, measure, options)

    return run


def _resolve(name: str) -> Strategy:
    from . import STRATEGIES

    if name not in STRATEGIES:
        raise ValueError(f"budgeted: unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
