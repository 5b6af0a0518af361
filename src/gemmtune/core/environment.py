"""What the settings check beyond one field's type: store locations, the cache directory, stage-1
runtime parameter names, the `GEMMTUNE_*` variables that are not `Settings` fields, and the warning
for a variable gemmtune does not read (a misspelt setting would otherwise do nothing, silently).

Example:
    >>> check_store("Memory"), check_store("OFF"), check_store("default"), check_store("picks.sqlite")
    ('memory', 'off', None, 'picks.sqlite')
    >>> check_store("redis://localhost:6379/0")
    'redis://localhost:6379/0'
    >>> check_store("s3://bucket/picks")
    Traceback (most recent call last):
    ...
    ValueError: unsupported store scheme 's3://' (a store is a SQLite file path, memory, off, default or a redis:// / rediss:// URL)
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from pathlib import Path
from typing import Any, Collection, Mapping

from .errors import SettingsError, SettingsWarning
from .spec import parse_bool, parse_int

RUNTIME_PARAM_NAMES = ("group", "swizzle")
"""Every runtime parameter a template has (`Template.runtime_space`), the names `stage1_runtime` accepts.
Kept here because core/ imports no template; tests/test_settings.py checks it against the templates."""

OTHER_VARIABLES: Mapping[str, str] = {
    "GEMMTUNE_CACHE_DIR": "where the store, numba's rendered kernels and compiled CUTLASS kernels live",
    "GEMMTUNE_CUTLASS_DISK": "a boolean: keep compiled CUTLASS kernels (cutlass_operators) on disk (default on)",
    "GEMMTUNE_WORKER_PROCESS": "set by gemmtune in the worker processes it starts",
    "GEMMTUNE_REDIS_PASSWORD": "the password of a redis:// store whose URL has none (store/redis_url.py)",
}
"""The `GEMMTUNE_*` variables gemmtune reads that are not `Settings` fields."""

STORE_KEYWORDS: Mapping[str, str | None] = {"memory": "memory", ":memory:": "memory", "off": "off", "default": None}
"""Store values read as keywords, in any case: memory (this process only), off (nothing kept, not even
in this process), default (store.sqlite in the cache dir).  Anything else is a file path."""

_WARNED: set[str] = set()


def check_store(value: Any) -> str | None:
    """A store location normalised: a keyword of `STORE_KEYWORDS` (any case), a Redis URL
    (`redis://`, `rediss://`) or a file path; ValueError for a blank value, `none` (ambiguous), a URL
    of another scheme or a directory."""
    if not isinstance(value, (str, os.PathLike)) or not isinstance(os.fspath(value), str):
        raise ValueError(f"expected a path, memory, off or default, got {type(value).__name__} {value!r}")
    text = os.fspath(value)
    word = text.strip().lower()
    if not word:
        raise ValueError(f"expected a path, memory, off or default, got the blank {text!r}")
    if word in STORE_KEYWORDS:
        return STORE_KEYWORDS[word]
    if word == "none":
        raise ValueError("'none' is ambiguous here: give off (keep nothing), memory (this process only) "
                         "or default (store.sqlite in the cache dir; also what an unset variable gives)")
    scheme = re.match(r"[a-z][a-z0-9+.-]*://", word)
    if scheme and scheme.group(0) in ("redis://", "rediss://"):
        return text.strip()
    if scheme:
        raise ValueError(f"unsupported store scheme {scheme.group(0)!r} (a store is a SQLite file path, memory, "
                         "off, default or a redis:// / rediss:// URL)")
    if Path(text).expanduser().is_dir():
        raise ValueError(f"{text!r} is a directory; give a file path in it, e.g. {os.path.join(text, 'store.sqlite')}")
    return text


def parse_runtime(text: str, name: str = "stage1_runtime") -> tuple[tuple[str, Any], ...]:
    """'swizzle=8' -> (('swizzle', 8),); a SettingsError naming `name` for anything else.

    Example:
        >>> parse_runtime("swizzle=8, group=1")
        (('group', 1), ('swizzle', 8))
    """
    try:
        return runtime_pairs(text)
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None


def runtime_pairs(text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ValueError(f"expected NAME=VALUE[,NAME=VALUE...], got {part.strip()!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        try:
            out.append((key, parse_int(value)))
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    return check_runtime(out)


def check_runtime(value: Any) -> tuple[tuple[str, int], ...]:
    """A mapping, pairs or "NAME=VALUE,..." text as sorted (name, int) pairs; ValueError(problem)."""
    if isinstance(value, str):
        return runtime_pairs(value)
    pairs = list(value.items()) if isinstance(value, Mapping) else value
    try:
        pairs = [(k, v) for k, v in pairs]
    except (TypeError, ValueError):
        raise ValueError(f"expected NAME=VALUE pairs or a mapping, got {value!r}") from None
    for k, v in pairs:
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"expected a parameter name, got {k!r}")
        if k not in RUNTIME_PARAM_NAMES:
            close = difflib.get_close_matches(k, RUNTIME_PARAM_NAMES, n=1)
            raise ValueError(f"unknown runtime parameter {k!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; the templates' runtime parameters are {', '.join(RUNTIME_PARAM_NAMES)}")
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{k}: expected an integer, got {v!r}")
    names = [k for k, _ in pairs]
    if not pairs or len(set(names)) < len(names):
        raise ValueError(f"expected distinct NAME=VALUE pairs, got {value!r}")
    return tuple(sorted(pairs))


def cache_dir() -> Path:
    """`$GEMMTUNE_CACHE_DIR`, else `$XDG_CACHE_HOME/gemmtune`, else `~/.cache/gemmtune`.  A blank
    (whitespace-only) `GEMMTUNE_CACHE_DIR` is a SettingsError: it would make a folder named " ".

    Example:
        >>> isinstance(cache_dir(), Path)
        True
    """
    env = os.environ.get("GEMMTUNE_CACHE_DIR")
    if env and not env.strip():
        raise SettingsError(f"GEMMTUNE_CACHE_DIR: expected a directory, got the blank {env!r}")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gemmtune"


def check_other_variables(env: Mapping[str, str]) -> None:
    """The non-field variables that have values to check, checked when settings are read (so that a
    typo in one is an error on every device, not only where it is used)."""
    raw = env.get("GEMMTUNE_CACHE_DIR")
    if raw and not raw.strip():
        raise SettingsError(f"GEMMTUNE_CACHE_DIR: expected a directory, got the blank {raw!r}")
    raw = env.get("GEMMTUNE_CUTLASS_DISK", "")
    if raw.strip():
        try:
            parse_bool(raw)
        except ValueError as exc:
            raise SettingsError(f"GEMMTUNE_CUTLASS_DISK: {exc}") from None


def warn_unknown(env: Mapping[str, str], known: Collection[str]) -> list[str]:
    """Warn (SettingsWarning, once per variable per process) about each `GEMMTUNE_*` variable of `env`
    outside `known`, naming the closest known one; returns the variables warned about now."""
    unknown = [k for k in env if k.startswith("GEMMTUNE_") and k not in known and k not in _WARNED]
    tails = {name[len("GEMMTUNE_"):]: name for name in known}
    for var in unknown:
        _WARNED.add(var)
        close = difflib.get_close_matches(var[len("GEMMTUNE_"):], tails, n=1)
        hint = f"; did you mean {tails[close[0]]}?" if close else ""
        warnings.warn(f"gemmtune: {var} is not a gemmtune setting and is ignored{hint} "
                      "(docs/SETTINGS.md lists the settings)", SettingsWarning, stacklevel=4)
    return unknown


def isolation_for(mode: str, device_type: str) -> str:
    """The isolation a tune on `device_type` uses: "auto" is "subprocess" on GPUs and "off" on CPU.

    Example:
        >>> isolation_for("auto", "cuda"), isolation_for("auto", "cpu"), isolation_for("off", "cuda")
        ('subprocess', 'off', 'off')
    """
    if mode == "auto":
        return "subprocess" if device_type == "cuda" else "off"
    return mode
