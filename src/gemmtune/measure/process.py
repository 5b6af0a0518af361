"""One worker process for one device, seen from the caller's side.

The worker is a fresh interpreter (`python -m gemmtune.measure.worker`), not a
multiprocessing spawn: spawn re-imports the caller's main module, which kills
a plain script without an `if __name__ == "__main__":` guard.  It connects back
through a `multiprocessing.connection.Listener` with the caller's authkey;
jobs and answers travel over that connection, pickled with the reductions
`torch.multiprocessing` registers (tensors by shared memory / CUDA IPC).
"""

from __future__ import annotations

import json
import multiprocessing
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.multiprocessing  # noqa: F401 - registers torch's tensor reductions for the connection's pickler

from ..core.children import child_env
from .jobs import WorkerJob, Setup
from .runners import RunFailed

START_TIMEOUT_S = 120.0  # a fresh interpreter importing torch, on a loaded machine


class WorkerLost(RunFailed):
    """The worker process died or stopped answering."""


def _worker_env(device: str) -> dict[str, str]:
    """The caller's environment, with the worker pinned to `device`'s GPU and gemmtune importable."""
    index = (torch.device(device).index or 0) if device.startswith("cuda") else None
    env = child_env(index)
    if index is not None and env.get("TRITON_PTXAS_PATH"):
        _same_ptxas(env, index)
    return env


def _same_ptxas(env: dict[str, str], index: int) -> None:
    """Point the worker at the ptxas whose version the caller's Triton cache keys carry.

    Triton keys its compile cache with the ptxas version, read once per process.  Inductor sets
    TRITON_PTXAS_PATH (torch's own ptxas) when it first compiles, so in a program that ran
    `torch.compile` the caller's keys may carry the version of Triton's bundled ptxas while a worker
    started later would read torch's: every binary the caller built would miss the worker's cache
    and be compiled again there, one by one (seen on the H200: a 4-problem warm-up took 24 s
    instead of 8).
    """
    try:
        from triton.backends.nvidia import compiler
    except Exception:  # noqa: BLE001 - no NVIDIA Triton backend: nothing is keyed by ptxas
        return
    if not compiler.get_ptxas_version.cache_info().currsize:
        return  # the caller has not keyed anything yet: it and the worker will read the same ptxas
    major, minor = torch.cuda.get_device_capability(index)
    if major >= 10:
        return  # Triton reads TRITON_PTXAS_BLACKWELL_PATH there, which Inductor leaves alone
    bundled = Path(compiler.__file__).parent / "bin" / "ptxas"
    choice = ptxas_matching(compiler.get_ptxas_version(major * 10 + minor), env["TRITON_PTXAS_PATH"],
                            str(bundled), _ptxas_version)
    if choice is None:
        env.pop("TRITON_PTXAS_PATH")
    elif choice != env["TRITON_PTXAS_PATH"]:
        env["TRITON_PTXAS_PATH"] = choice


def ptxas_matching(keyed: str, configured: str, bundled: str, version_of: Any) -> str | None:
    """The ptxas a worker should use so that its cache keys equal the caller's: `configured` (the
    TRITON_PTXAS_PATH in effect) if its version is the one the caller's keys carry, else Triton's
    `bundled` one (returned as None: leave TRITON_PTXAS_PATH unset) if that matches, else `configured`.

    Example:
        >>> versions = {"/torch/bin/ptxas": "13.0", "/triton/bin/ptxas": "12.9"}
        >>> ptxas_matching("12.9", "/torch/bin/ptxas", "/triton/bin/ptxas", versions.get) is None
        True
        >>> ptxas_matching("13.0", "/torch/bin/ptxas", "/triton/bin/ptxas", versions.get)
        '/torch/bin/ptxas'
    """
    if version_of(configured) == keyed:
        return configured
    return None if version_of(bundled) == keyed else configured


def _ptxas_version(path: str) -> str | None:
    """`ptxas --version`'s output, as Triton reads it for its keys (None: it does not run)."""
    try:
        return subprocess.check_output([path, "--version"], timeout=30).decode("utf-8")
    except (OSError, subprocess.SubprocessError):
        return None


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
    """One worker process for one device; `call(job)` runs a job there and returns its value.
    `env`: the worker's whole environment (default: the caller's, pinned to `device`'s GPU)."""

    def __init__(self, device: str, timeout_s: float, env: Mapping[str, str] | None = None):
        self.device, self.timeout_s = device, timeout_s
        self.env = dict(env) if env is not None else None
        self.restarts = 0
        self._setup: Setup | None = None  # re-sent after a restart
        self._start()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _start(self) -> None:
        authkey = multiprocessing.current_process().authkey
        listener = Listener(authkey=authkey)
        self.proc = subprocess.Popen([sys.executable, "-m", "gemmtune.measure.worker"], stdin=subprocess.PIPE,
                                     env=self.env if self.env is not None else _worker_env(self.device))
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

    def call(self, job: WorkerJob, timeout_s: float | None = None) -> Any:
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
