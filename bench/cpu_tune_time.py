"""How long the first CPU tune of a new shape takes, per effort (store off, warm numba cache).

Each tune runs in a fresh process, as a model's first forward would: its time includes loading the
numba kernels from the on-disk cache, the correctness reference, the timings and the final.  A first
pass (not reported) warms the numba cache.  Also reports the machine's load average: on a shared
machine the numbers move with it.

    python bench/cpu_tune_time.py --out bench/results/cpu_tune_time.json
    python bench/cpu_tune_time.py --shapes 128x128x128 --efforts quick --budget-s 1

Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ("128x128x128", "512x384x256", "1024x1024x1024")  # M x N x K; 512x384x256: A 512x256, B 256x384
ONE = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, gemmtune
M, N, K = (int(x) for x in sys.argv[1].split("x"))
kw = dict(store="off")
if sys.argv[3] != "none":
    kw["budget_s"] = float(sys.argv[3])
settings = gemmtune.Settings(**kw).with_(effort=sys.argv[2])
a, b = torch.randn(M, K), torch.randn(K, N)
imported = time.perf_counter()
sel = gemmtune.tune("mm", a, b, settings=settings)
t = sel.timings
print(json.dumps({"tune_s": time.perf_counter() - imported, "import_s": imported - t0, "compile_s": sel.compile_s,
                  "prescreen_s": sel.prescreen_s, "final_s": sel.benchmark_s, "runs": sel.benchmark_runs,
                  "winner": sel.winner.key, "winner_ms": sel.winner_ms, "noisy": getattr(sel, "noisy", None),
                  "provisional": getattr(sel, "provisional", None), "budget_exhausted": sel.budget_exhausted,
                  "spread": max([x.spread for x in t if getattr(x, "spread", None) is not None], default=None)}))
"""


def run_one(shape: str, effort: str, budget_s: float | None) -> dict:
    """One tune in a fresh process; its JSON line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", ONE, shape, effort, "none" if budget_s is None else str(budget_s)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--efforts", default="default,quick")
    p.add_argument("--budget-s", type=float, default=None)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    shapes, efforts = args.shapes.split(","), args.efforts.split(",")
    for shape in shapes:  # warm the numba cache (and the OS page cache) first
        run_one(shape, "quick", None)
    rows = []
    print(f"{'shape':>16} {'effort':>8} {'tune s':>7} {'compile':>7} {'pre':>6} {'final':>6} {'runs':>4} "
          f"{'spread':>6} {'noisy':>5} {'prov':>5} {'load':>5}  winner")
    for shape in shapes:
        for effort in efforts:
            for _ in range(args.repeat):
                r = run_one(shape, effort, args.budget_s)
                r.update(shape=shape, effort=effort, budget_s=args.budget_s, load=os.getloadavg()[0])
                rows.append(r)
                spread = "-" if r["spread"] is None else f"{r['spread']:.2f}"
                print(f"{shape:>16} {effort:>8} {r['tune_s']:7.2f} {r['compile_s']:7.2f} {r['prescreen_s']:6.2f} "
                      f"{r['final_s']:6.2f} {r['runs']:4d} {spread:>6} {str(r['noisy']):>5} "
                      f"{str(r['provisional']):>5} {r['load']:5.1f}  {r['winner']} ({r['winner_ms']:.4g} ms)",
                      flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M"),
                                              "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
