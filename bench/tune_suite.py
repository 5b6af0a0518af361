"""Tune every shape of a suite on the GPU and compare against cuBLAS in the same run.

For each shape: gemmtune's default (prescreen) pick, its time and cuBLAS's
(torch.mm) time measured interleaved, tuning wall time, number of choices and
benchmark runs.  For the shapes named with --exhaustive, exhaustive search too,
with both picks re-timed interleaved to give prescreen's regret.

    python bench/tune_suite.py --suite bench/shapes.json --out results.json \
        --exhaustive square-2048,square-8192,odd-1000

Prints a markdown table and writes JSON (after every shape, so a cut-off run keeps its results).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

import torch

import gemmtune
from gemmtune.measure.timers import CudaTimer
from gemmtune.report import selection_dict
from gemmtune.offline.suite import load_suite


def interleaved(timer, fns, rounds=30):
    return [m.cost_ms for m in timer.time_interleaved(fns, rounds)]


def run_shape(spec, timer, exhaustive: bool) -> dict:
    """One shape: the default tune (and the exhaustive one), their picks timed interleaved with cuBLAS."""
    tensors = spec.tensors("cuda")
    a, b = tensors[-2], tensors[-1]
    t0 = time.perf_counter()
    pre = gemmtune.tune(spec.op, *tensors)
    wall = time.perf_counter() - t0
    row = {"name": spec.name, "problem": spec.describe(), "M": spec.M, "K": spec.K, "N": spec.N,
           "winner": pre.winner.key, "winner_is_library": pre.winner.is_extern,
           "n_choices": pre.n_choices, "benchmark_runs": pre.benchmark_runs,
           "tuning_wall_s": wall, "compile_s": pre.compile_s, "benchmark_s": pre.benchmark_s,
           "prescreen_s": pre.prescreen_s, "selection": selection_dict(pre)}
    fns = [lambda: pre(*tensors), lambda: torch.mm(a, b)]
    if exhaustive:
        t0 = time.perf_counter()
        exh = gemmtune.tune(spec.op, *tensors, strategy="exhaustive")
        row.update(exh_winner=exh.winner.key, exh_benchmark_runs=exh.benchmark_runs,
                   exh_tuning_wall_s=time.perf_counter() - t0, exh_benchmark_s=exh.benchmark_s + exh.prescreen_s)
        fns.append(lambda: exh(*tensors))
    times = interleaved(timer, fns)
    row.update(winner_ms=times[0], cublas_ms=times[1], speedup_vs_cublas=times[1] / times[0],
               tflops=2 * spec.M * spec.N * spec.K / times[0] / 1e9)
    if len(times) > 2:
        same = row["exh_winner"] == row["winner"]
        row.update(exh_ms=times[2], regret_pct=0.0 if same else 100 * (times[0] / times[2] - 1))
    return row


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="bench/shapes.json")
    p.add_argument("--out", default="tune_suite.json")
    p.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    p.add_argument("--exhaustive", default="", help="comma-separated shape names also tuned exhaustively")
    p.add_argument("--skip-prescreen-only", action="store_true", help="only run the --exhaustive shapes")
    args = p.parse_args()
    specs = load_suite(args.suite)
    only = {s for s in args.only.split(",") if s}
    exh_names = {s for s in args.exhaustive.split(",") if s}
    if only:
        specs = [s for s in specs if s.name in only]
    if args.skip_prescreen_only:
        specs = [s for s in specs if s.name in exh_names]
    timer = CudaTimer(torch.device("cuda"), rep_ms=50)
    meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "gemmtune": gemmtune.__version__, "python": platform.python_version(), "command": " ".join(sys.argv)}
    rows = []
    for spec in specs:
        row = run_shape(spec, timer, spec.name in exh_names)
        rows.append(row)
        print(f"{spec.name}: {row['winner']} {row['winner_ms']:.4f} ms, cuBLAS {row['cublas_ms']:.4f} ms, "
              f"x{row['speedup_vs_cublas']:.3f}, tune {row['tuning_wall_s']:.1f}s", flush=True)
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
    print_table(rows, meta)
    return 0


def print_table(rows, meta):
    print(f"\n{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}")
    print("| shape | problem | gemmtune pick | ms | cuBLAS ms | speedup | TFLOP/s | tune s | choices | runs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['problem']} | `{r['winner']}` | {r['winner_ms']:.4f} | {r['cublas_ms']:.4f} | "
              f"{r['speedup_vs_cublas']:.3f} | {r['tflops']:.0f} | {r['tuning_wall_s']:.1f} | {r['n_choices']} | "
              f"{r['benchmark_runs']} |")
    ex = [r for r in rows if "exh_winner" in r]
    if ex:
        print("\n| shape | prescreen pick | exhaustive pick | regret % | prescreen runs | exhaustive runs | run ratio |")
        print("|---|---|---|---|---|---|---|")
        for r in ex:
            print(f"| {r['name']} | `{r['winner']}` | `{r['exh_winner']}` | {r['regret_pct']:.2f} | "
                  f"{r['benchmark_runs']} | {r['exh_benchmark_runs']} | {r['exh_benchmark_runs'] / r['benchmark_runs']:.1f}x |")


if __name__ == "__main__":
    sys.exit(main())
