"""A store that reads from another and keeps its writes for someone else to make.

A problem tuned in a worker process of a multi-GPU deal (`gemmtune.measure.devices`) reads the
store of the location the caller uses (a SQLite file, a Redis server: what earlier runs kept; an
in-memory location: nothing), but writes nothing there: each `save` is recorded as a `Saved` and
sent back, and the caller writes it into its own store (`write`).  So the store is written once per
pick, by one process, with the store's own rules (first writer wins, compare-and-set on a re-tune),
whatever the location.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

from . import locations
from .keys import Row


@dataclass(frozen=True)
class Saved:
    """The arguments of one `Store.save`, to be made by another process."""

    env: str
    info: dict
    problem: str
    describe: str
    rows: tuple[Row, ...]
    pick: Row
    replace_pick: bool | Row
    provisional: str | None

    def write(self, store: Any) -> Row:
        """Make this save in `store`; returns the pick `store` holds afterwards."""
        return store.save(self.env, self.info, self.problem, self.describe, list(self.rows), self.pick,
                          replace_pick=self.replace_pick, provisional=self.provisional)


class RelayStore:
    """Reads go to `inner`; a `save` is kept in `saved` (and answered as if it won) instead.

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> inner, pick = Store(":memory:"), Row("aten_mm", None, "{}", "{}", 1.0, "ok")
        >>> relay = RelayStore(inner)
        >>> relay.save("env", {}, "p", "p", [pick], pick, replace_pick=False) == pick, inner.load("env", "p").pick
        (True, None)
        >>> _ = relay.saved[0].write(inner); inner.load("env", "p").pick.template
        'aten_mm'
    """

    def __init__(self, inner: Any):
        self.inner = inner
        self.saved: list[Saved] = []

    def save(self, env: str, info: dict[str, Any], problem: str, describe: str, rows: list[Row], pick: Row,
             replace_pick: bool | Row, provisional: str | None = None) -> Row:
        self.saved.append(Saved(env, dict(info), problem, describe, tuple(rows), pick, replace_pick, provisional))
        return pick

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextlib.contextmanager
def relaying(location: str | None) -> Iterator[RelayStore]:
    """Within the block, `shared_store(location)` is a RelayStore over that location's store: the
    tunes run there (the eager dispatch's, Inductor's) write nothing, their saves are kept.

    Example:
        >>> with relaying("memory") as relay:
        ...     locations.shared_store("memory") is relay
        True
    """
    key = location or "default"
    before = locations._STORES.get(key)
    relay = RelayStore(before if before is not None else locations.open_store(location))
    locations._STORES[key] = relay
    try:
        yield relay
    finally:
        if before is None:
            locations._STORES.pop(key, None)
        else:
            locations._STORES[key] = before
