"""A model's warm-up in a torch.distributed job (gloo, CPU): one rank alone against W ranks, where
`gemmtune.warmup` deals the problems across the ranks (store/distributed.py).

Each run is a fresh `torchrun` job with its own empty caches; the time is the slowest rank's
`warmup` call.  Each rank writes its result to a file of its own, which this script reads.  Prints a
table and writes JSON.

    python bench/distributed_warmup.py --ranks 1,4 --out bench/results/distributed_warmup.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time, torch, torch.distributed as dist, gemmtune
dist.init_process_group("gloo")
shapes = [(32, 64 * (1 + i % 4), 32 * (1 + i // 4)) for i in range(8)]
layers = torch.nn.ModuleList(torch.nn.Linear(k, n, bias=False) for _, k, n in shapes)
class Many(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.layers = layers
    def forward(self, xs):
        return [l(x) for l, x in zip(self.layers, xs)]
model, xs = Many(), [torch.randn(m, k) for m, k, _ in shapes]
dist.barrier()
t = time.perf_counter()
report = gemmtune.warmup(model, xs, progress=False)
seconds = time.perf_counter() - t
# One file per rank (sys.argv[1] is the folder): torchrun merges the ranks' standard outputs.
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"rank": dist.get_rank(), "seconds": seconds, "tuned": report.tuned,
               "winners": [r.winner for r in report.rows]}, f)
dist.barrier()
dist.destroy_process_group()
"""


def run(ranks: int, cache: Path | None = None, backends: str | None = None) -> dict:
    root = Path(tempfile.mkdtemp())
    (root / "child.py").write_text(CHILD)
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(cache or root / "cache"), "GEMMTUNE_STORE": "memory",
           "OMP_NUM_THREADS": "1", "GEMMTUNE_NOISE_LIMIT": "1e9", **({"GEMMTUNE_BACKENDS": backends} if backends else {})}
    out = root / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           str(root / "child.py"), str(out)]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    if done.returncode != 0 or sorted(r["rank"] for r in rows) != list(range(ranks)):
        raise SystemExit(f"ranks={ranks}: rc {done.returncode}: {done.stderr[-2000:]}")
    return dict(ranks=ranks, warmup_s=max(r["seconds"] for r in rows), job_s=time.perf_counter() - started,
                tuned=[r["tuned"] for r in rows], same_picks=len({tuple(r["winners"]) for r in rows}) == 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--ranks", default="1,4", help="comma-separated rank counts, one torchrun job each; the first "
                                                   "is the baseline of the 'x one rank' column (default: 1,4)")
    p.add_argument("--backends", default=None,
                   help="backend families to tune among (GEMMTUNE_BACKENDS, e.g. extern,numpy for a quick run; "
                        "default: every CPU family)")
    p.add_argument("--warm-numba", action="store_true",
                   help="fill numba's on-disk cache first (one rank), so that every timed run tunes but compiles "
                        "nothing: the comparison is then of the tuning work alone")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    cache = Path(tempfile.mkdtemp()) if args.warm_numba else None
    if cache is not None:
        run(1, cache, args.backends)
    res = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "cpus": os.cpu_count(),
           "warm_numba": args.warm_numba, "backends": args.backends,
           "runs": [run(int(r), cache, args.backends) for r in args.ranks.split(",")]}
    base = res["runs"][0]["warmup_s"]
    print("| ranks | warm-up s (slowest rank) | x one rank | problems tuned per rank | same picks on every rank |")
    print("|---|---|---|---|---|")
    for r in res["runs"]:
        print(f"| {r['ranks']} | {r['warmup_s']:.2f} | {r['warmup_s'] / base:.2f} | {r['tuned']} | {r['same_picks']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
