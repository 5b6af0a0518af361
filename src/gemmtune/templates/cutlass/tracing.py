"""The one lock of every CuTe DSL compile in a process.

The DSL's tracing is not thread-safe (4.8.1: two compiles in two threads fail with "An MLIR function
requires a Location", and on the H200 host a tune of `cutlass_operators` whose compile threads ran
the library's `compile` at once aborted the process).  gemmtune compiles in a thread pool, so a
CuTe DSL template (`cutlass_operators`) takes this lock around a compile: one kernel at a time per
process.
Parallel compiles go to the compile processes (`parallel.py`).

Example:
    >>> from gemmtune.templates.cutlass.tracing import DSL_COMPILE_LOCK
    >>> with DSL_COMPILE_LOCK:
    ...     pass
"""

from __future__ import annotations

import threading

__all__ = ["DSL_COMPILE_LOCK"]

DSL_COMPILE_LOCK = threading.Lock()
