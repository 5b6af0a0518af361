"""One worker process for one device, seen from the caller's side.

The worker is a fresh interpreter (`python -m gemmtune.bench.worker`), not a
multiprocessing spawn: spawn re-imports the caller's main module, which kills
a plain script without an `if __name__ == "__main__":` guard.  It connects back
through a `multiprocessing.connection.Listener` with the caller's authkey;
jobs and answers travel over that connection, pickled with the reductions
`torch.multiprocessing` registers (tensors by shared memory / CUDA IPC).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - registers torch's tensor reductions for the connection's pickler

from .jobs import Job, Setup
from .runners import RunFailed

START_TIMEOUT_S = 120.0  # a fresh interpreter importing torch, on a loaded machine
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the gemmtune package


class WorkerLost(RunFailed):
    """The worker process died or stopped answering."""


def _worker_env(device: str) -> dict[str, str]:
    """The caller's environment, with the worker pinned to `device`'s GPU and gemmtune importable."""
    env = dict(os.environ)
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[index] if visible else str(index)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
    env["GEMMTUNE_WORKER_PROCESS"] = "1"  # gemmtune/__init__ skips the public API's imports there
    return env


def _accept(listener: Listener, proc: subprocess.Popen, timeout_s: float) -> Connection:
    """The worker's connection, or WorkerLost when it exits or does not call within `timeout_s`."""
    got: list[Any] = []

    def accept() -> None:
        try:
            got.append(listener.accept())
        except Exception as exc:  # noqa: BLE001 - handed to the waiting thread
            got.append(exc)

    thread = threading.Thread(target=accept, daemon=True, name="gemmtune-accept")
    thread.start()
    end = time.monotonic() + timeout_s
    while thread.is_alive() and proc.poll() is None and time.monotonic() < end:
        thread.join(0.05)
    if thread.is_alive():  # no call came: wake the accept with a bare socket, which fails its handshake
        _poke(listener.address)
        thread.join(5.0)
    listener.close()
    if got and isinstance(got[0], Connection):
        return got[0]
    raise WorkerLost(f"worker did not start (exit code {proc.poll()})")


def _poke(address: Any) -> None:
    try:
        with socket.socket(socket.AF_UNIX if isinstance(address, str) else socket.AF_INET) as s:
            s.settimeout(1.0)
            s.connect(address)
    except OSError:
        pass


class Worker:
    """One worker process for one device; `call(job)` runs a job there and returns its value."""

    def __init__(self, device: str, timeout_s: float):
        self.device, self.timeout_s = device, timeout_s
        self.restarts = 0
        self._setup: Setup | None = None  # re-sent after a restart
        self._start()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _start(self) -> None:
        authkey = multiprocessing.current_process().authkey
        listener = Listener(authkey=authkey)
        self.proc = subprocess.Popen([sys.executable, "-m", "gemmtune.bench.worker"], stdin=subprocess.PIPE,
                                     env=_worker_env(self.device))
        hello = {"address": listener.address, "authkey": authkey.hex(), "path": [str(p) for p in sys.path]}
        try:
            assert self.proc.stdin is not None  # started with stdin=PIPE
            self.proc.stdin.write(json.dumps(hello).encode() + b"\n")
            self.proc.stdin.close()
        except OSError:  # it died at once: _accept reports it
            pass
        self.conn = _accept(listener, self.proc, START_TIMEOUT_S)

    def setup(self, job: Setup, timeout_s: float) -> None:
        self._setup = job
        self.call(job, timeout_s=timeout_s)

    def forget_setup(self) -> None:
        self._setup = None

    def call(self, job: Job, timeout_s: float | None = None) -> Any:
        """Run `job` in the worker.  Raises WorkerLost (died, hung, CUDA context lost) or
        RuntimeError (the job raised there)."""
        timeout_s = timeout_s or self.timeout_s
        try:
            self.conn.send(job)
            if not self.conn.poll(timeout_s):
                raise WorkerLost(f"no answer within {timeout_s:g} s (hang)")
            status, value = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise WorkerLost(f"worker died (exit code {self._exit_code(1.0)})") from exc
        if status == "fatal":  # the worker's CUDA context was poisoned; it has exited
            self._exit_code(5.0)
            raise WorkerLost(f"CUDA context lost: {value}")
        if status == "error":
            raise RuntimeError(value)
        return value

    def _exit_code(self, wait_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def restart(self) -> None:
        self.close(kill=True)
        self.restarts += 1
        self._start()
        if self._setup is not None:
            self.call(self._setup, timeout_s=max(self.timeout_s, START_TIMEOUT_S))

    def close(self, kill: bool = False) -> None:
        """Stop the worker: closing the connection ends its loop; `kill`, or no exit within 2 s, kills it."""
        self.conn.close()
        if not kill and self._exit_code(2.0) is not None:
            return
        if self.alive:
            self.proc.kill()
        self._exit_code(5.0)
