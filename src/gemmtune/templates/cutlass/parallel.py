"""`cutlass_operators` compiles in parallel, in separate processes.

The DSL's tracing is not thread-safe, so in one process its compiles run one at a time (about 1.3-2 s
per operator on the H200 host).  When a tune is about to compile several
of a template's binaries (`prepare_compiles`), they are handed to a few compile processes instead
(`python -m gemmtune.templates.cutlass.compile_process`, a fresh interpreter: it never imports the
caller's `__main__`).  Each compiles its share with operands of the same shapes, strides and device
and keeps the result on disk (`disk`); the caller's `compile` of a binary waits for its file and loads
it (milliseconds), so the wait is part of the tune's compile time.  A job says which template's
compiler builds it (`kind`: "operators").  A job that fails in a compile
process is compiled in the caller as before, so the processes can only save time.  Fewer than
`MIN_BATCH` pending binaries (or a machine with fewer than four cores) are compiled in the caller: a
process's start, importing torch and the DSL, costs more than a few compiles
(on the 2-core CPU machine, 2026-11-30: 8 CuTe DSL kernels 3.25 s in the caller, 4.84 s in two
processes).

Example:
    >>> chunks([{"path": str(i)} for i in range(5)], 2)
    [[{'path': '0'}, {'path': '2'}, {'path': '4'}], [{'path': '1'}, {'path': '3'}]]
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout  # not the built-in one before Python 3.11

from ...core.children import child_env

log = logging.getLogger("gemmtune")
MIN_BATCH = 16  # a process's start (torch and the DSL imported: seconds) must buy back more than it costs
WAIT_S = 900.0  # a compile process that has not answered by then is given up on: the caller compiles
_PENDING: dict[str, Future] = {}  # kernel file -> None (kept) or the reason it was not
_LOCK = threading.Lock()


def workers() -> int:
    """Compile processes per batch: half the cores, at most 8 (each holds the DSL's compiler)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def chunks(jobs: list[dict], n: int) -> list[list[dict]]:
    """`jobs` dealt round-robin into `n` shares."""
    return [jobs[i::n] for i in range(n) if jobs[i::n]]


def start(jobs: list[dict], env: dict[str, str] | None = None, processes: int | None = None,
          min_batch: int = MIN_BATCH, cuda_index: int | None = None, label: str = "cutlass_operators") -> int:
    """Compile `jobs` (from `operators_lib.job_for`) in compile processes,
    with `env` added to theirs and the caller's GPU `cuda_index` (None: none) as theirs; returns how
    many were handed over (0: fewer than `min_batch` not already pending, or one process at most: the
    caller compiles them).  `label` names the template in the log line."""
    processes = processes or workers()
    with _LOCK:
        fresh = [j for j in jobs if j["path"] not in _PENDING]
        if len(fresh) < min_batch or processes < 2:
            return 0
        shares = chunks(fresh, processes)
        for share in shares:
            _PENDING.update({j["path"]: Future() for j in share})
    for share in shares:
        threading.Thread(target=_run, args=(share, child_env(cuda_index, **(env or {}))),
                         name="gemmtune-cutlass-compile", daemon=True).start()
    log.info("gemmtune: %s: %d binaries compile in %d processes", label, len(fresh), len(shares))
    return len(fresh)


def wait(path: str, timeout_s: float = WAIT_S) -> str | None:
    """Block until a compile process is done with `path`: None when the kernel is on disk, else why
    not ("not pending": no process has it)."""
    with _LOCK:
        future = _PENDING.get(path)
    if future is None:
        return "not pending"
    try:
        return future.result(timeout=timeout_s)
    except FutureTimeout:
        return f"no answer within {timeout_s:g} s"


def _run(share: list[dict], env: dict[str, str]) -> None:
    """One compile process for `share` (its environment `env`); every job's future is resolved,
    whatever happens."""
    futures = {j["path"]: _PENDING[j["path"]] for j in share}
    code: object
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gemmtune.templates.cutlass.compile_process"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert proc.stdin is not None and proc.stdout is not None  # both pipes were asked for
        proc.stdin.write(json.dumps({"path": sys.path, "jobs": share}))
        proc.stdin.close()
        for line in proc.stdout:
            try:
                answer = json.loads(line)
            except ValueError:  # something else printed to stdout (a library's notice): not an answer
                continue
            future = futures.get(answer.get("path")) if isinstance(answer, dict) else None
            if future is not None and not future.done():
                future.set_result(answer.get("error"))
        code = proc.wait()
    except Exception as exc:  # noqa: BLE001 - the jobs fall back to the caller's compile
        code = f"{type(exc).__name__}: {exc}"
    for future in futures.values():
        if not future.done():
            future.set_result(f"compile process ended ({code}) before this job")
