"""Triton's cache manager for gemmtune's own compiles only (`Settings.share_kernels`, `store.kernels`).

Triton asks one process-wide knob which class manages its on-disk cache
(`triton.knobs.cache.manager_class`).  A manager that serves kernels from a shared store must not serve
the user's own Triton kernels, nor Inductor's compiles, so it is in place only while gemmtune compiles
or loads a kernel:

- `serve(cls)` names the class (None: none); nothing is installed yet;
- `scope()` is entered around each of gemmtune's compiles, in the thread that compiles
  (`measure.compile.CompileJob`).  The first open scope sets the knob, the last one to close puts back
  what was there before; a knob someone else set meanwhile is left alone;
- while a scope is open in one thread, another thread of the process may compile too, and Triton gives
  it the same class: `in_scope()` tells the manager that this thread is not gemmtune's, and it acts
  as Triton's own file cache there.

A knob already set to another class (the user's `TRITON_CACHE_MANAGER`) is never replaced.

Example:
    >>> serve(None)
    >>> with scope() as mine:
    ...     mine, in_scope()
    (False, True)
    >>> in_scope()
    False
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["serve", "served", "scope", "in_scope"]

log = logging.getLogger("gemmtune")
_UNSET = object()
_LOCAL = threading.local()
_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"cls": None, "open": 0, "prior": _UNSET, "installed": False, "refused": set()}


def serve(cls: type | None) -> None:
    """The manager class gemmtune's compiles use from now on (None: Triton's own)."""
    with _LOCK:
        _STATE["cls"] = cls


def served() -> type | None:
    """The class `serve` named."""
    return _STATE["cls"]


def in_scope() -> bool:
    """Whether this thread is inside `scope()`: compiling for gemmtune."""
    return getattr(_LOCAL, "depth", 0) > 0


@contextmanager
def scope() -> Iterator[bool]:
    """Around one of gemmtune's compiles (or loads) in this thread: the class `serve` named is Triton's
    manager meanwhile.  Yields whether it is (False: none named, or another class set)."""
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    with _LOCK:
        mine = _open()
    try:
        yield mine
    finally:
        _LOCAL.depth -= 1
        with _LOCK:
            _close()


def _open() -> bool:
    cls = _STATE["cls"]
    _STATE["open"] += 1
    if cls is None:
        return False
    if _STATE["installed"]:
        return _knobs().manager_class is cls
    knobs = _knobs()
    current = knobs.manager_class
    if current is not None and current is not cls:
        if current not in _STATE["refused"]:  # said once per process and class
            _STATE["refused"].add(current)
            log.warning("gemmtune: share_kernels: Triton already uses cache manager %s; kernels are not shared",
                        getattr(current, "__name__", current))
        return False
    _STATE["prior"] = knobs.__dict__.get("manager_class", _UNSET)
    knobs.manager_class = cls
    _STATE["installed"] = cls
    return True


def _close() -> None:
    _STATE["open"] -= 1
    installed = _STATE["installed"]
    if _STATE["open"] or not installed:
        return
    knobs = _knobs()
    if knobs.__dict__.get("manager_class") is installed:  # not set by someone else meanwhile
        if _STATE["prior"] is _UNSET:
            del knobs.manager_class
        else:
            knobs.manager_class = _STATE["prior"]
    _STATE.update(installed=False, prior=_UNSET)


def _knobs() -> Any:
    from triton import knobs

    return knobs.cache
