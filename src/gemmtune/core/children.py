"""The environment of a process gemmtune starts (an isolation worker, a CUTLASS compile process).

Each is a fresh interpreter (`python -m ...`), never a multiprocessing spawn, so the caller's
`__main__` is never imported again there.  It gets the caller's environment, gemmtune importable
from where the caller imported it, the public API's imports skipped (`gemmtune/__init__` reads
GEMMTUNE_WORKER_PROCESS), and for a GPU the caller's device as its only visible one.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the gemmtune package


def child_env(cuda_index: int | None = None, **extra: str) -> dict[str, str]:
    """The child's environment: `extra` on top, pinned to the caller's GPU `cuda_index` (None: no GPU).

    Example:
        >>> env = child_env(None, CUTE_DSL_ARCH="sm_90a")
        >>> env["GEMMTUNE_WORKER_PROCESS"], env["CUTE_DSL_ARCH"], env["PYTHONPATH"].split(os.pathsep)[0] == PACKAGE_ROOT
        ('1', 'sm_90a', True)
    """
    env = {**os.environ, **extra, "GEMMTUNE_WORKER_PROCESS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)}
    if cuda_index is not None:  # the child sees one GPU, the caller's (its cuda:0)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[cuda_index] if visible else str(cuda_index)
    return env
