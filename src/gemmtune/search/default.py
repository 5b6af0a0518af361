"""`default`: whatever `tune` does when nothing is asked for.

The strategy name and top X are the defaults of `gemmtune.Settings`; the stage-1 runtime
values are each template's `default_runtime` (triton_mm: swizzle 8).  Nothing is repeated
here, so changing a default there changes `default` too.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

from ..core.choices import Choice
from .base import Measure, Measured, Strategy, StrategyOptions


def settings_default(name: str) -> Any:
    """The default value of one `Settings` field (environment variables not applied)."""
    from ..core.settings import Settings

    return next(f.default for f in dataclasses.fields(Settings) if f.name == name)


@functools.lru_cache(maxsize=1)
def template_stage1() -> Mapping[str, Mapping[str, Any]]:
    """Each shipped template's stage-1 runtime values, by uid (usable here or not: a replay of recorded
    timings needs the values `tune` would use on the machine that recorded them)."""
    from ..templates.registry import default_templates, optional_templates

    shipped = [*default_templates(), *optional_templates()]
    return {t.uid: dict(t.default_runtime) for t in shipped if t.default_runtime}


def default_options(options: StrategyOptions | None = None) -> StrategyOptions:
    """`options` (or fresh ones) with tune's default top X and, where missing, template stage-1 values.

    Example:
        >>> default_options().stage1["triton_mm"], default_options().top_x, default_options().stage0_n
        ({'swizzle': 8}, 4, 20)
    """
    if options is None:
        options = StrategyOptions(top_x=settings_default("top_x"), stage0_n=settings_default("stage0_n"))
    return dataclasses.replace(options, stage1={**template_stage1(), **options.stage1})


def default(choices: Sequence[Choice], measure: Measure, options: StrategyOptions) -> list[Measured]:
    """Run `Settings().strategy` (today: model_pruned, N=20) with template stage-1 defaults filled in.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> [m.ms for m in default([Choice("a", None)], lambda cs, st: [1.0] * len(cs), StrategyOptions())]
        [1.0]
    """
    return default_search(default_prune(choices, options), measure, options)


def default_prune(choices: Sequence[Choice], options: StrategyOptions) -> list[Choice]:
    """What the delegate prunes with tune's defaults (model_pruned on a GPU: the cost model's stage 0)."""
    strategy, options = _delegate(options)
    return strategy.prune(choices, options)


def default_search(choices: Sequence[Choice], measure: Measure, options: StrategyOptions) -> list[Measured]:
    """The delegate's search with tune's defaults (the caller pruned already)."""
    strategy, options = _delegate(options)
    return strategy.search(choices, measure, options)


def _delegate(options: StrategyOptions) -> tuple[Strategy, StrategyOptions]:
    from . import STRATEGIES, for_device

    name = for_device(settings_default("strategy"), options.device_type)
    if name == "default":
        raise ValueError("Settings.strategy defaults to 'default': nothing to delegate to")
    # tune's own defaults, whatever `options` says of them (budgets and the problem are kept); the
    # cost model needs the problem's dimensions, so without them nothing is pruned (as tune on CPU)
    stage0_n = settings_default("stage0_n") if options.problem is not None else None
    options = dataclasses.replace(options, top_x=settings_default("top_x"), stage0_n=stage0_n)
    return STRATEGIES[name], default_options(options)
