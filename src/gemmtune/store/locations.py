"""Where a store lives: `open_store` turns a location (a setting's value) into a store object, and
`shared_store` keeps one per location per process."""

from __future__ import annotations

from typing import Any

from .redis_store import RedisStore, is_redis_url
from . import sqlite
from .sqlite import Store

_STORES: dict[str, Any] = {}


def open_store(location: str | None) -> Any:
    """`None`/"default": the SQLite file in the cache dir; "memory": this process only; a
    `redis://` or `rediss://` URL: that server (`store.redis_store`); else a SQLite path."""
    if is_redis_url(location):
        return RedisStore(str(location))
    if location in (None, "", "default"):
        return Store(sqlite.default_cache_dir() / "store.sqlite")  # looked up at call time (tests point it elsewhere)
    if location == "memory":
        return Store(":memory:")
    return Store(location)


def shared_store(location: str | None) -> Any:
    """One Store per location per process; "off" gives a fresh, empty one every time.

    Example:
        >>> shared_store("memory") is shared_store("memory"), shared_store("off") is shared_store("off")
        (True, False)
    """
    if location == "off":
        return Store(":memory:")
    key = location or "default"
    if key not in _STORES:
        _STORES[key] = open_store(location)
    return _STORES[key]


def forget_stores() -> None:
    """Drop the stores this process opened, as a new process would start: the next `shared_store`
    opens each location again (benchmarks of a second start, tests).

    Example:
        >>> s = shared_store("memory"); forget_stores(); shared_store("memory") is s
        False
    """
    _STORES.clear()
