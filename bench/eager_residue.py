"""Does tuning leave the calling process slower?  The Llama-shaped stack (bench/models.py) is timed
eager, plain, before any tuning; then gemmtune warms it up (candidates measured in the isolated
worker), and the plain and the patched model are timed again; then again after the worker is shut
down and CUDA IPC handles are collected.  One process, one GPU, the same model throughout.

    python bench/eager_residue.py --m 512 --out residue.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import build, steady  # noqa: E402

import torch  # noqa: E402

import gemmtune  # noqa: E402
from gemmtune.measure.isolation import shutdown_workers  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--m", default="512,64")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default="residue.json")
    args = p.parse_args()
    rows = []
    for m in (int(v) for v in args.m.split(",")):
        model, (x,) = build("stack", m)
        fwd = lambda: model(x)  # noqa: E731
        row = {"M": m}
        with torch.no_grad():
            row["plain_before"] = steady(fwd, args.iters)["ms"]
            t0 = time.perf_counter()
            gemmtune.warmup(model, x, progress=False, release=False)
            row["warmup_s"] = time.perf_counter() - t0
            row["patched"] = steady(fwd, args.iters)["ms"]
            gemmtune.unpatch(model)
            row["plain_after_tuning"] = steady(fwd, args.iters)["ms"]
            shutdown_workers()
            torch.cuda.ipc_collect()
            row["plain_after_shutdown"] = steady(fwd, args.iters)["ms"]
            gemmtune.patch(model)
            row["patched_after_shutdown"] = steady(fwd, args.iters)["ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
