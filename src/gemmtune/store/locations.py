"""Where a store lives: `open_store` turns a location (a setting's value) into a store object, and
`shared_store` keeps one per location and trust policy per process."""

from __future__ import annotations

from typing import Any

from .redis_store import RedisStore, is_redis_url
from . import sqlite
from .sqlite import Store
from .trust import Trust

_STORES: dict[Any, Any] = {}


def open_store(location: str | None, trust: Trust | None = None) -> Any:
    """`None`/"default": the SQLite file in the cache dir; "memory": this process only; a
    `redis://` or `rediss://` URL: that server (`store.redis_store`); else a SQLite path.
    `trust`: the policy it is read under (`store.trust`; None: `Settings.from_env()`'s)."""
    trust = trust if trust is not None else _env_trust()
    if is_redis_url(location):
        return RedisStore(str(location), trust=trust)
    if location in (None, "", "default"):  # looked up at call time (tests point it elsewhere)
        return Store(sqlite.default_cache_dir() / "store.sqlite", trust=trust)
    if location == "memory":
        return Store(":memory:", trust=trust)
    return Store(location, trust=trust)


def _env_trust() -> Trust:
    from ..core.settings import Settings

    return Trust.of(Settings.from_env())


def shared_store(location: str | None, trust: Trust | None = None) -> Any:
    """One store per location and trust policy per process; "off" gives a fresh, empty one every time.
    `trust`: None reads the policy from the environment (`Settings.from_env()`).

    Example:
        >>> shared_store("memory") is shared_store("memory"), shared_store("off") is shared_store("off")
        (True, False)
    """
    trust = trust if trust is not None else _env_trust()
    if location == "off":
        return Store(":memory:", trust=trust)
    key = location or "default"
    slot = key if trust == Trust() or trust.fingerprint == Trust().fingerprint else (key, trust.fingerprint)
    if slot not in _STORES:
        _STORES[slot] = open_store(location, trust)
    return _STORES[slot]


def store_for(settings: Any) -> Any:
    """The store a `gemmtune.Settings` names, under its trust policy (`shared_store`).

    Example:
        >>> from gemmtune.core.settings import Settings
        >>> store_for(Settings(store="memory")) is shared_store("memory")
        True
    """
    return shared_store(settings.store, Trust.of(settings))


def forget_stores() -> None:
    """Drop the stores this process opened, as a new process would start: the next `shared_store`
    opens each location again (benchmarks of a second start, tests).

    Example:
        >>> s = shared_store("memory"); forget_stores(); shared_store("memory") is s
        False
    """
    _STORES.clear()
