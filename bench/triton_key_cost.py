"""What Triton's hash of its own installation costs a process, with and without gemmtune's kept key
(`Settings.triton_key_cache`, templates/triton/key_cache.py).

Each timing is a fresh Python process that imports Triton and then calls `triton.runtime.cache.triton_key()`
once, which is what a process's first Triton compile or cache load does.  "Triton's own": the key as
Triton computes it (`GEMMTUNE_TRITON_KEY_CACHE=0`); "kept": gemmtune's key installed, its file already
written by an earlier process.  Prints a table and writes JSON.

    python bench/triton_key_cost.py --reps 5 --out triton_key_cost.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, time
t0 = time.perf_counter()
import triton, triton.runtime.cache as cache
t1 = time.perf_counter()
from gemmtune.templates.triton import key_cache
key_cache.ensure()
t2 = time.perf_counter()
cache.triton_key()
t3 = time.perf_counter()
print(json.dumps(dict(import_s=t1 - t0, install_s=t2 - t1, key_s=t3 - t2, kept=key_cache.installed(),
                      triton=triton.__version__)))
"""


def probe(cache_dir: str, kept: bool) -> dict:
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": cache_dir, "GEMMTUNE_TRITON_KEY_CACHE": "1" if kept else "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"triton_key_cost: the probe failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="fresh processes per variant")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    with tempfile.TemporaryDirectory() as d:
        probe(d, kept=True)  # writes the kept key
        runs = {name: [] for name in ("own", "kept")}
        for _ in range(args.reps):  # interleaved, so drift hits both alike
            runs["own"].append(probe(d, kept=False))
            runs["kept"].append(probe(d, kept=True))
    print(f"{'variant':<16} {'import triton s':>16} {'triton_key() s':>15} {'kept':>5}")
    rows = {}
    for name, label in (("own", "Triton's own"), ("kept", "kept (gemmtune)")):
        med = {k: statistics.median(r[k] for r in runs[name]) for k in ("import_s", "key_s")}
        rows[name] = dict(median=med, runs=runs[name])
        print(f"{label:<16} {med['import_s']:>16.3f} {med['key_s']:>15.4f} {str(runs[name][0]['kept']):>5}")
    result = dict(command="python " + " ".join([Path(__file__).relative_to(ROOT).as_posix(), *(argv or sys.argv[1:])]),
                  date=datetime.date.today().isoformat(), host=platform.node(), cpus=os.cpu_count(),
                  triton=runs["own"][0]["triton"], reps=args.reps, variants=rows)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
