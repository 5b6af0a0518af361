"""A model's warm-up in a torch.distributed job (gloo, on the CPUs): one rank alone against W ranks, among
which `gemmtune.warmup` deals the problems; every rank must end with the same picks.

Each run is a fresh `torchrun` job with its own empty caches and an 8-layer model of 8 problems; the
time is the slowest rank's `warmup` call (gemmtune's import of its dispatch layer timed apart: a cost
of each process), with its parts: its own tunes, the store hits of the problems other ranks tuned, the
recording forward and the in-model check.  Prints a table; writes JSON with `--out`.

    python bench/distributed_warmup.py --ranks 1,2,4 --warm-numba --out distributed_warmup.json
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
t = time.perf_counter()
warmup = gemmtune.warmup  # gemmtune imports its dispatch layer on first use: a cost of the process, apart
if sys.argv[2] == "preload":  # the CPU backends (numba's kernels) loaded on an unrelated problem, timed apart
    from gemmtune.core.settings import Settings
    gemmtune.tune("mm", torch.randn(24, 40), torch.randn(40, 56), settings=Settings.from_env().with_(
        distributed="off", store="off"))
import_s = time.perf_counter() - t
dist.barrier()
t = time.perf_counter()
report = warmup(model, xs, progress=False)
seconds = time.perf_counter() - t
# One file per rank (sys.argv[1] is the folder): torchrun merges the ranks' standard outputs.
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"rank": dist.get_rank(), "seconds": seconds, "import_s": import_s, "tuned": report.tuned,
               "tune_s": sum(r.seconds for r in report.rows if not r.from_store),
               "from_store_s": sum(r.seconds for r in report.rows if r.from_store),
               "forward_s": report.forward_s, "check_s": report.check_s,
               "winners": [r.winner for r in report.rows]}, f)
dist.barrier()
dist.destroy_process_group()
"""


def run(ranks: int, cache: Path | None = None, preload: bool = False) -> dict:
    """One `torchrun` job of `ranks` ranks: the slowest rank's warm-up and its parts."""
    root = Path(tempfile.mkdtemp())
    (root / "child.py").write_text(CHILD)
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(cache or root / "cache"), "GEMMTUNE_STORE": "memory",
           "OMP_NUM_THREADS": "1", "GEMMTUNE_NOISE_LIMIT": "1e9"}  # GEMMTUNE_BACKENDS, where set, passes on
    out = root / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           str(root / "child.py"), str(out), "preload" if preload else "-"]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    if done.returncode != 0 or sorted(r["rank"] for r in rows) != list(range(ranks)):
        raise SystemExit(f"ranks={ranks}: rc {done.returncode}: {done.stderr[-2000:]}")
    slowest = max(rows, key=lambda r: r["seconds"])
    return dict(ranks=ranks, warmup_s=slowest["seconds"], job_s=time.perf_counter() - started,
                with_import_s=max(r["seconds"] + r["import_s"] for r in rows),
                tuned=[r["tuned"] for r in rows], same_picks=len({tuple(r["winners"]) for r in rows}) == 1,
                slowest={k: slowest[k] for k in ("rank", "import_s", "tune_s", "from_store_s", "forward_s", "check_s")})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--ranks", default="1,4", help="rank counts, one torchrun job each (the first: the baseline)")
    p.add_argument("--warm-numba", action="store_true", help="fill numba's cache first: the runs compile nothing")
    p.add_argument("--preload", action="store_true", help="each rank loads the CPU backends first, timed apart")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    cache = Path(tempfile.mkdtemp()) if args.warm_numba else None
    if cache is not None:
        run(1, cache)
    res = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "cpus": os.cpu_count(),
           "warm_numba": args.warm_numba, "backends": os.environ.get("GEMMTUNE_BACKENDS"), "preload": args.preload,
           "runs": [run(int(r), cache, args.preload) for r in args.ranks.split(",")]}
    base = res["runs"][0]["warmup_s"]
    print("| ranks | warm-up s (slowest rank) | x one rank | its tunes s | store hits s | forward s | in-model check s "
          "| with gemmtune's import s | problems tuned per rank | same picks on every rank |\n" + "|---" * 10 + "|")
    for r in res["runs"]:
        w = r["slowest"]
        print(f"| {r['ranks']} | {r['warmup_s']:.2f} | {r['warmup_s'] / base:.2f} | {w['tune_s']:.2f} | "
              f"{w['from_store_s']:.2f} | {w['forward_s']:.2f} | {w['check_s']:.2f} | {r['with_import_s']:.2f} | "
              f"{r['tuned']} | {r['same_picks']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
