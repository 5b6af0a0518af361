"""A CUTLASS compile process (`parallel`): jobs as JSON on stdin, one JSON line per job on stdout.

    python -m gemmtune.templates.cutlass.compile_process < jobs.json

Each job's `kind` names the module whose `compile_job` builds it and keeps it on disk: "hopper"
(`cutlass_hopper`, the default) or "operators" (`cutlass_operators`).  A module is imported on its
first job, so a process with only `cutlass_operators` jobs never imports the hand-written kernel.

Example:
    >>> sorted(COMPILERS)
    ['hopper', 'operators']
"""

from __future__ import annotations

import importlib
import json
import sys

COMPILERS = {"hopper": "hopper_kernel", "operators": "operators_lib"}


def compile_one(job: dict) -> str | None:
    """Build `job` with its kind's `compile_job`: None when it is on disk, else why not."""
    try:
        module = importlib.import_module(f"{__package__}.{COMPILERS[job.get('kind', 'hopper')]}")
        module.compile_job(job)
        return None
    except Exception as exc:  # noqa: BLE001 - reported; the caller compiles this one itself
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def main() -> None:
    """Compile each job and keep it on disk; answer `{"path": ..., "error": None or why}` per job."""
    request = json.loads(sys.stdin.read())
    sys.path[:] = [*request["path"], *(p for p in sys.path if p not in request["path"])]
    for job in request["jobs"]:
        print(json.dumps({"path": job["path"], "error": compile_one(job)}), flush=True)


if __name__ == "__main__":
    main()
