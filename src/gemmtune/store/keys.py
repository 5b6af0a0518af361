"""The store's keys and rows, shared by every store (`store.sqlite`, `store.redis`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping


def canon(params: Any) -> str:
    """Canonical JSON of a config or runtime-params mapping (sorted keys).  A choice's pairs (a tuple) are
    written once per process and then looked up: a store read keys hundreds of choices per problem.

    Example:
        >>> canon({"b": 1, "a": True}), canon((("a", True), ("b", 1))), canon((("a", 1), ("b", 1)))
        ('{"a":true,"b":1}', '{"a":true,"b":1}', '{"a":1,"b":1}')
        >>> canon((("t", (1, 2)),)), canon((("t", (True, 2)),)), canon((("x", -0.0),)), canon((("x", 0.0),))
        ('{"t":[1,2]}', '{"t":[true,2]}', '{"x":-0.0}', '{"x":0.0}')
    """
    if type(params) is tuple and all(type(v) in _PLAIN for _, v in params):
        typed = tuple((k, type(v), v) for k, v in params)  # True and 1 are equal keys, but not equal JSON
        text = _CANON.get(typed)
        if text is None:
            text = json.dumps(dict(params), sort_keys=True, separators=(",", ":"))
            if len(_CANON) < 65536:
                _CANON[typed] = text
        return text
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


_CANON: dict[tuple, str] = {}  # `canon` of the pairs seen (bounded)
_PLAIN = (int, bool, str, type(None))  # values whose type and value say their JSON (not 0.0 and -0.0, nor a tuple's)


@dataclass(frozen=True)
class Row:
    template: str
    src_hash: str | None
    config: str
    runtime: str
    ms: float | None
    status: str
    stage: str | None = None

    @property
    def choice_key(self) -> tuple[str, str, str]:
        return (self.template, self.config, self.runtime)


@dataclass(frozen=True)
class Stored:
    rows: tuple[Row, ...]
    pick: Row | None
    provisional: str | None = None  # the run that decided the pick under heavy noise: a later run re-checks it
    sigs: Mapping[Any, str] | None = field(default=None, compare=False)  # signatures: "pick", row choice keys


def env_info(device: str) -> dict[str, Any]:
    """What a timing depends on besides the problem: device and versions (`store/env.py` lists them).

    Example:
        >>> info = env_info("cpu")
        >>> info["cpu_model"] == info["device"], "numba" in info, "triton" in info
        (True, True, False)
    """
    from .env import device_env

    return device_env(device)


def env_key(info: dict[str, Any]) -> str:
    """The store key of an env_info: a hash of all of it.

    Example:
        >>> env_key({"device": "a"}) != env_key({"device": "b"}), len(env_key({}))
        (True, 16)
    """
    return hashlib.sha256(canon(info).encode()).hexdigest()[:16]
