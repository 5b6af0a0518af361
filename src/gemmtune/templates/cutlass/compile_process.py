"""A CUTLASS compile process (`parallel`): jobs as JSON on stdin, one JSON line per job on stdout.

    python -m gemmtune.templates.cutlass.compile_process < jobs.json

Each job's `kind` names the module whose `compile_job` builds it and keeps it on disk: "operators"
(`cutlass_operators`, the default).  A module is imported on its first job.

Example:
    >>> sorted(COMPILERS)
    ['operators']
"""

from __future__ import annotations

import importlib
import json
import sys

COMPILERS = {"operators": "operators_lib"}


def compile_one(job: dict) -> str | None:
    """Build `job` with its kind's `compile_job`: None when it is on disk, else why not."""
    try:
        module = importlib.import_module(f"{__package__}.{COMPILERS[job.get('kind', 'operators')]}")
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
