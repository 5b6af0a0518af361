"""Two BLAS thread pools in one process: torch.mm and numpy's matmul, each alone and interleaved.

torch's CPU kernels and numpy's BLAS (OpenBLAS in the numpy wheels) keep separate thread pools.  This
times each one back to back, then alternating with the other, then after a pause following the
other's call.  Median ms per call; prints a table and writes JSON.

    python bench/blas_pools.py --n 1024 --out bench/results/blas_pools.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch


def one(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--out", default="blas_pools.json")
    args = p.parse_args()
    n, reps = args.n, args.reps
    a, b, o = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    an, bn, on = a.numpy(), b.numpy(), np.empty((n, n), np.float32)
    mm = lambda: torch.mm(a, b, out=o)  # noqa: E731
    npm = lambda: np.matmul(an, bn, out=on)  # noqa: E731
    for _ in range(3):
        mm()
        npm()
    rows: dict[str, float] = {}
    rows["torch.mm back to back"] = statistics.median(one(mm) for _ in range(reps))
    rows["numpy back to back"] = statistics.median(one(npm) for _ in range(reps))
    pairs = [(one(npm), one(mm)) for _ in range(reps)]
    rows["numpy right after torch.mm"] = statistics.median(x for x, _ in pairs)
    rows["torch.mm right after numpy"] = statistics.median(y for _, y in pairs)
    for pause in (0.05, 0.4):
        after = []
        for _ in range(reps):
            npm()
            time.sleep(pause)
            after.append(one(mm))
        rows[f"torch.mm {pause * 1e3:.0f} ms after numpy"] = statistics.median(after)
    print(f"| {n}x{n}x{n} float32, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()} | ms per call |")
    print("|---|---:|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.2f} |")
    meta = {"n": n, "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "numpy": np.__version__, "date": time.strftime("%Y-%m-%d %H:%M"), "load": os.getloadavg()[0]}
    Path(args.out).write_text(json.dumps({"meta": meta, "ms": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
