"""Exhaustive search: time every choice once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..core.choices import Choice, Timing
from .base import Measure, Options, ranking


@dataclass(frozen=True)
class ExhaustiveOptions(Options):
    """Exhaustive search has no knobs: every choice is timed once, whatever the effort."""


def exhaustive(choices: Sequence[Choice], measure: Measure, options: ExhaustiveOptions) -> list[Timing]:
    """Time every choice; return them fastest first.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> cs = [Choice("a", None), Choice("b", None)]
        >>> [m.choice.template_uid for m in exhaustive(cs, lambda c, s: [2.0, 1.0], ExhaustiveOptions())]
        ['b', 'a']
    """
    times = measure(choices, "final")
    return ranking([Timing(c, ms, "final") for c, ms in zip(choices, times)])
