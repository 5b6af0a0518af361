"""The worker process: `python -m gemmtune.measure.worker`, started by gemmtune.measure.isolation.

A fresh interpreter with its own entry point, so it never imports the caller's
`__main__` (a plain script without an `if __name__ == "__main__":` guard can
tune with isolation).  It reads one JSON line on stdin (the caller's listener
address, its multiprocessing authkey and sys.path), connects back, then runs
the jobs it receives (gemmtune.measure.jobs) until the connection closes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - registers torch's tensor reductions for the connection's pickler

from .jobs import WorkerJob, WorkerState


def main() -> None:
    """Connect back to the caller and serve it."""
    from multiprocessing.connection import Client

    hello = json.loads(sys.stdin.readline())
    authkey = bytes.fromhex(hello["authkey"])
    # CPU tensors arrive as file descriptors fetched from the caller's resource sharer, which
    # admits only processes holding the caller's authkey.
    multiprocessing.current_process().authkey = authkey
    # The caller's path first: template classes are unpickled from the caller's modules.
    sys.path[:] = [*hello["path"], *(p for p in sys.path if p not in hello["path"])]
    address = hello["address"]
    try:
        conn = Client(tuple(address) if isinstance(address, list) else address, authkey=authkey)
    except (OSError, EOFError):  # the caller is gone (it exited, or cancelled an unused start): nothing to serve
        return
    serve(conn)


def serve(conn: Any) -> None:
    """Answer each job with ("ok", value), ("error", text) or ("fatal", text); after "fatal", exit."""
    state = WorkerState()
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the caller closed the connection: stop
            return
        except Exception as exc:  # noqa: BLE001 - a job that cannot be unpickled here (class not importable)
            conn.send(("error", _text(exc)))
            continue
        answer = _answer(job, state)
        conn.send(answer)
        if answer[0] == "fatal":
            os._exit(3)


def _answer(job: WorkerJob, state: WorkerState) -> tuple[str, Any]:
    try:
        value = job.run(state)
    except Exception as exc:  # noqa: BLE001 - report, keep serving
        # A sticky CUDA error (illegal address, ...) spends this process: say so and exit.
        return ("error" if _context_healthy() else "fatal", _text(exc))
    failed = job.failure(value)
    if failed is not None and not _context_healthy():
        return ("fatal", str(failed)[:300])
    return ("ok", value)


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _context_healthy() -> bool:
    """False when this process's CUDA context is poisoned (every later CUDA call would fail)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return True
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return False


if __name__ == "__main__":
    main()
