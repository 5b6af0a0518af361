"""Triton's once-per-process set-up, started in the background before a warm-up needs it.

A process's first Triton compile, or first load of a kernel from a cache, imports Triton's compiler
and hashes Triton's own library into its cache key (`triton.runtime.cache.triton_key`, which reads the
whole of libtriton): about 0.45 s of a warm-store warm-up on the H200 (bench/warmup_profile.py,
cProfile), on the path to the first pick.  `prewarm()` runs both in a daemon thread, so they overlap
the recording forward that comes first; the hashing releases the GIL.  The result is Triton's own
cached value, so nothing differs but when it is computed.

Example:
    >>> t = prewarm()
    >>> t is None or t.join(60) is None
    True
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("gemmtune")
_STARTED: list[threading.Thread] = []


def _run() -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception as exc:  # noqa: BLE001 - another Triton: the first compile does it, as before
        log.debug("gemmtune: Triton's set-up not started early: %s", exc)


def prewarm() -> threading.Thread | None:
    """Start Triton's set-up in the background once per process (None where it already started, or
    under the interpreter, which compiles nothing)."""
    from .base import interpreting, triton_available

    if _STARTED or interpreting() or not triton_available():
        return None
    thread = threading.Thread(target=_run, name="gemmtune-triton-prewarm", daemon=True)
    _STARTED.append(thread)
    thread.start()
    return thread


__all__ = ["prewarm"]
