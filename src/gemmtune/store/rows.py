"""The store's boundary for timings: a `gemmtune.Timing` becomes a stored `Row` (`to_row`), and a
stored row becomes a Timing again (`to_timing`).  Every layer above the store holds Timings; only the
stores (`store.sqlite`, `store.redis_store`) hold rows, their storage format.

Example:
    >>> from gemmtune.core.choices import Choice, as_params
    >>> c = Choice("triton_mm", "h1", as_params({"BLOCK_M": 64}), as_params({"swizzle": 8}))
    >>> row = to_row(Timing(c, 0.5, "final"))
    >>> row.config, row.stage, to_timing(row).choice == c, to_timing(row).stage
    ('{"BLOCK_M":64}', 'final', True, 'store')
"""

from __future__ import annotations

import json

from ..core.choices import Choice, Timing, as_params
from .keys import Row, canon

STORED = "from the store"  # the detail of a recalled timing


def to_row(timing: Timing) -> Row:
    """The row that stores `timing`: its choice's template, source hash, config and runtime params
    (canonical JSON), its time, status and stage."""
    c = timing.choice
    return Row(c.template_uid, c.src_hash, canon(c.config), canon(c.runtime), timing.ms, timing.status, timing.stage)


def pick_row(choice: Choice, ms: float | None = None, strategy: str | None = None) -> Row:
    """The row of a stored pick: the winner, its time and (in the stage column) the strategy that picked it."""
    return Row(choice.template_uid, choice.src_hash, canon(choice.config), canon(choice.runtime), ms, "ok", strategy)


def to_timing(row: Row, choice: Choice | None = None) -> Timing:
    """The timing `row` stores, recalled (stage "store"); `choice`: the current choice it belongs to
    (its layout and family kept), else one rebuilt from the row."""
    if choice is None:
        choice = Choice(row.template, row.src_hash, as_params(json.loads(row.config)), as_params(json.loads(row.runtime)))
    return Timing(choice, row.ms, "store", row.status, STORED)
