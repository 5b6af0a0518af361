"""What every search strategy receives and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..choices import Choice

Measure = Callable[[Sequence[Choice], str], list["float | None"]]
"""`measure(choices, stage) -> ms per choice` (None: failed or wrong).  Every call is recorded."""


@dataclass(frozen=True)
class Measured:
    choice: Choice
    ms: float | None
    stage: str


@dataclass(frozen=True)
class StrategyOptions:
    """Knobs a strategy may read.

    `stage1` maps a template uid to the runtime params used in prescreening's
    first stage (e.g. {"triton_mm": {"swizzle": 8}}).
    """

    top_x: int = 5
    stage1: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def ranking(measured: Sequence[Measured]) -> list[Measured]:
    """Successful measurements, fastest first; failures last."""
    ok = sorted((m for m in measured if m.ms is not None), key=lambda m: m.ms)
    return ok + [m for m in measured if m.ms is None]
