"""Where a store lives: `open_store` turns a location (a setting's value) into a store object."""

from __future__ import annotations

from typing import Any

from .redis_store import RedisStore, is_redis_url
from . import sqlite
from .sqlite import Store


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
