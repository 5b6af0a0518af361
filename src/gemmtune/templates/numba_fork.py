"""Numba kernels in a fork child: GNU OpenMP threads do not survive fork.

Numba's "omp" threading layer on GNU OpenMP (the one its Linux wheels use when TBB is not installed)
is not fork-safe: a child forked after the parent ran a parallel kernel is killed by SIGTERM ("fork()
called from a process already using GNU OpenMP, this is unsafe") as soon as it runs one.  Fork is
Linux's default start method (DataLoader workers, multiprocessing pools), so an at-fork handler marks
such a child, and there `fork_safe` hands the launcher a serial compilation of the same kernel source
(compiled in the child on first use and not cached: Numba's cache index cannot tell it from the
parallel one).  A child of a process whose Numba runs on TBB, workqueue or Intel OpenMP, or that ran
no parallel kernel before the fork, keeps the parallel kernels.  docs/RELIABILITY.md says what is
supported.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["gnu_openmp_started", "fork_safe", "in_gnu_openmp_fork_child"]

_SERIAL: dict[int, Any] = {}  # id(parallel dispatcher) -> its serial twin (fork children only)
_FORKED_FROM_GNU_OMP = False


def gnu_openmp_started() -> bool:
    """Whether this process runs Numba's parallel kernels on GNU OpenMP threads (they do not survive fork).

    Example:
        >>> isinstance(gnu_openmp_started(), bool)
        True
    """
    if "numba" not in sys.modules:
        return False
    import numba

    try:
        if numba.threading_layer() != "omp":
            return False
    except ValueError:  # no parallel kernel has run yet: a child starts its own threads
        return False
    try:
        omppool = importlib.import_module("numba.np.ufunc.omppool")
    except ImportError:
        return True
    return getattr(omppool, "openmp_vendor", "GNU") == "GNU"


def in_gnu_openmp_fork_child() -> bool:
    """Whether this process was forked from one whose Numba ran on GNU OpenMP threads."""
    return _FORKED_FROM_GNU_OMP


def _after_fork_in_child() -> None:
    global _FORKED_FROM_GNU_OMP
    _FORKED_FROM_GNU_OMP = _FORKED_FROM_GNU_OMP or gnu_openmp_started()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_safe(gemm: Any) -> Any:
    """The compiled kernel `gemm` itself, or, in a fork child of a GNU OpenMP process, its serial twin."""
    if not _FORKED_FROM_GNU_OMP:
        return gemm
    serial = _SERIAL.get(id(gemm))
    if serial is None:
        import numba

        serial = _SERIAL[id(gemm)] = numba.njit(cache=False, fastmath=False)(gemm.py_func)
    return serial
