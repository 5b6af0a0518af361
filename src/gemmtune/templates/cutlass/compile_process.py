"""A `cutlass_hopper` compile process (`parallel`): jobs as JSON on stdin, one JSON line per job on stdout.

    python -m gemmtune.templates.cutlass.compile_process < jobs.json
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    """Compile each job and keep it on disk; answer `{"path": ..., "error": None or why}` per job."""
    request = json.loads(sys.stdin.read())
    sys.path[:] = [*request["path"], *(p for p in sys.path if p not in request["path"])]
    from . import hopper_kernel

    for job in request["jobs"]:
        try:
            hopper_kernel.compile_job(job)
            error = None
        except Exception as exc:  # noqa: BLE001 - reported; the caller compiles this one itself
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(json.dumps({"path": job["path"], "error": error}), flush=True)


if __name__ == "__main__":
    main()
