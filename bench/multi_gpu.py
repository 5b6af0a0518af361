"""Throughput of `gemmtune tune --suite` on 1 against N GPUs of one host, and whether the picks agree.

Each run is a fresh `gemmtune tune --suite ... --gpus N` process with its own empty store and its own
empty Triton cache (so no run reuses another's compiles), timed end to end.  For every shape the
N-GPU pick is compared with the one-GPU pick: identical, or else its time in the one-GPU run's own
timings (same process, same timer) within `--tolerance` (1%) of the one-GPU winner's.

    python bench/multi_gpu.py --gpus 2,4,8 --out bench/results/multi_gpu.json
    python bench/multi_gpu.py --dry-run            # the commands, run nothing (no GPU needed)

Prints a table (GPUs, wall s, shapes/s, speed-up over one GPU, picks identical / within tolerance)
and writes the JSON (every run's command, wall time and per-shape comparison).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default=str(REPO / "bench" / "shapes.json"), help="suite file (default: the public suite)")
    p.add_argument("--gpus", default="2", help="comma-separated GPU counts to compare with one GPU (default 2)")
    p.add_argument("--out", default="multi_gpu.json", help="JSON file to write")
    p.add_argument("--tolerance", type=float, default=0.01, help="a differing pick's allowed regret (default 0.01)")
    p.add_argument("--extra", default="", help="more `gemmtune tune` arguments, e.g. '--effort quick'")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = p.parse_args(argv)
    try:
        args.counts = sorted({int(c) for c in args.gpus.split(",") if c.strip()} - {1})
    except ValueError:
        p.error(f"--gpus: expected comma-separated integers, got {args.gpus!r}")
    if not args.counts or min(args.counts) < 2:
        p.error("--gpus: give at least one count of 2 or more")
    return args


def command(args: argparse.Namespace, gpus: int, work: Path) -> tuple[list[str], dict[str, str]]:
    """The `gemmtune tune` run on `gpus` GPUs, and its environment (fresh store and Triton cache)."""
    cmd = [sys.executable, "-m", "gemmtune", "tune", "--suite", args.suite, "--device", "cuda", "--gpus", str(gpus),
           "--store", str(work / f"store-{gpus}.sqlite"), "--json", str(work / f"picks-{gpus}.json"),
           "--no-progress", *args.extra.split()]
    env = {**os.environ, "TRITON_CACHE_DIR": str(work / f"triton-{gpus}"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)}
    return cmd, env


def run(args: argparse.Namespace, gpus: int, work: Path) -> dict:
    cmd, env = command(args, gpus, work)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"multi_gpu: {' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    results = json.loads((work / f"picks-{gpus}.json").read_text())["results"]
    return {"gpus": gpus, "command": " ".join(cmd), "wall_s": wall, "results": results}


def compare(one: list[dict], many: list[dict], tolerance: float) -> list[dict]:
    """Per shape: the two picks, identical or not, and the N-GPU pick's regret in the one-GPU run's timings."""
    rows = []
    for a, b in zip(one, many):
        same = a["winner_key"] == b["winner_key"]
        times = {(c["name"], json.dumps(c["runtime_params"], sort_keys=True)): c["ms"] for c in a["choices"]}
        other = times.get((b["winner"], json.dumps(b["winner_runtime_params"], sort_keys=True)))
        regret = 0.0 if same else (None if other is None or not a["winner_ms"] else other / a["winner_ms"] - 1)
        rows.append({"name": a["name"], "one_gpu": a["winner_key"], "n_gpus": b["winner_key"], "identical": same,
                     "regret": regret, "within": same or (regret is not None and regret <= tolerance)})
    return rows


def table(runs: list[dict], shapes: int) -> str:
    base = runs[0]["wall_s"]
    lines = ["| GPUs | wall s | shapes/s | speed-up | picks identical | within tolerance |", "|---|---|---|---|---|---|"]
    for r in runs:
        cmp = r.get("comparison", [])
        same = sum(c["identical"] for c in cmp) if cmp else shapes
        within = sum(c["within"] for c in cmp) if cmp else shapes
        lines.append(f"| {r['gpus']} | {r['wall_s']:.1f} | {shapes / r['wall_s']:.3f} | {base / r['wall_s']:.2f}x | "
                     f"{same}/{shapes} | {within}/{shapes} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        work = Path(tempfile.gettempdir()) / "gemmtune-multi-gpu-RUN"
        for gpus in (1, *args.counts):
            cmd, env = command(args, gpus, work)
            print(f"TRITON_CACHE_DIR={env['TRITON_CACHE_DIR']} {' '.join(cmd)}")
        return 0
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < max(args.counts):
        print(f"multi_gpu: error: --gpus {max(args.counts)} needs that many CUDA devices, {visible} visible",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gemmtune-multi-gpu-"))
    runs = [run(args, 1, work)]
    for gpus in args.counts:
        r = run(args, gpus, work)
        r["comparison"] = compare(runs[0]["results"], r["results"], args.tolerance)
        runs.append(r)
    shapes = len(runs[0]["results"])
    print(table(runs, shapes))
    doc = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0), "visible": visible,
           "suite": args.suite, "tolerance": args.tolerance,
           "runs": [{k: v for k, v in r.items() if k != "results"} for r in runs]}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
