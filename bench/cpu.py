"""gemmtune on a CPU: each shape of a suite tuned, then its pick timed against torch's own op.

For each shape: `gemmtune.tune` with the store off (its wall time is the tuning time; the first shape also pays
numba's compile unless numba's cache is warm), then the pick and torch's op (`torch.mm`, `torch.addmm`, `torch.bmm`)
timed with `torch.utils.benchmark` in interleaved rounds (the pick as a warm eager call runs it: torch's op itself for
an aten mm or bmm pick), in a shuffled order each round; the ratio is the median of the per-round ratios torch / pick
(above 1: the pick is faster).  The machine's load average is recorded: on a busy machine CPU timings move with it.
`--busy N` keeps N processes running torch matmuls while each shape is tuned (not while its pick is timed): what a
pick made on a busy machine costs once the machine is quiet.  Prints a table; writes JSON after every shape.

    python bench/cpu.py --out bench/results/cpu_suite_2core_2026-12-06.json
    python bench/cpu.py --suite bench/shapes_cpu.json --only square-128,odd-100x300x200 --rounds 5
    python bench/cpu.py --busy 2 --squares 32,64,96,128,192,256,320,384,448,512   # tuned on a busy machine
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.utils.benchmark as benchmark

import gemmtune
from gemmtune.dispatch.eager import selection_runner
from gemmtune.offline.suite import ProblemSpec, load_suite

ROOT = Path(__file__).resolve().parents[1]
TORCH_OPS = {"mm": torch.mm, "addmm": torch.addmm, "bmm": torch.bmm}
SPIN = "import torch\na = torch.randn(384, 384)\nwhile True:\n    a @ a"  # a busy neighbour: torch on every core


def cpu_name() -> str:
    """The CPU's model name and the cores this process may use."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "cpu")
    return f"{model}, {len(os.sched_getaffinity(0))} cores"


def paired_rounds(pick, ref, rounds: int, seed: int) -> tuple[float, float, float]:
    """Median ms of `pick` and `ref`, and the median per-round ratio ref / pick, in shuffled rounds."""
    timers = {"pick": benchmark.Timer("f()", globals={"f": pick}), "ref": benchmark.Timer("f()", globals={"f": ref})}
    number = max(1, int(0.02 / max(timers["ref"].timeit(3).median, 1e-7)))  # about 20 ms a reading
    rng, ms, ratios = random.Random(seed), {"pick": [], "ref": []}, []
    for _ in range(rounds):
        names = list(timers)
        rng.shuffle(names)
        got = {n: timers[n].timeit(number).median * 1e3 for n in names}
        for n in names:
            ms[n].append(got[n])
        ratios.append(got["ref"] / got["pick"])
    return statistics.median(ms["pick"]), statistics.median(ms["ref"]), statistics.median(ratios)


def run_shape(spec, rounds: int, settings, busy: int = 0) -> dict:
    """Tune one shape (store off), with `busy` spinning processes beside it, then, once they are gone,
    time its pick against torch's op."""
    tensors, spinners = spec.tensors("cpu"), [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        t0 = time.perf_counter()
        sel = gemmtune.tune(spec.op, *tensors, settings=settings, progress=False)
        tune_s = time.perf_counter() - t0
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    ref = TORCH_OPS[spec.op]
    torch.testing.assert_close(sel(*tensors), ref(*tensors), rtol=1e-3, atol=1e-3)
    pick = selection_runner(spec.op, sel, 1.0, 1.0, None, None)  # what a warm gemmtune.mm / addmm / bmm runs
    pick_ms, torch_ms, ratio = paired_rounds(lambda: pick(*tensors), lambda: ref(*tensors), rounds, seed=spec.M)
    return {"name": spec.name, "op": spec.op, "M": spec.M, "K": spec.K, "N": spec.N, "batch": spec.batch,
            "dtype": spec.dtype, "pick": sel.winner.key, "library_pick": sel.winner.is_extern,
            "provisional": sel.provisional, "pick_ms": round(pick_ms, 5), "torch_ms": round(torch_ms, 5),
            "ratio_vs_torch": round(ratio, 4), "tune_s": round(tune_s, 3), "choices": sel.n_choices}


def summary(rows: list[dict]) -> dict:
    ratios = [r["ratio_vs_torch"] for r in rows]
    return {"n": len(rows), "library_picks": sum(r["library_pick"] for r in rows),
            "geomean_vs_torch": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4),
            "worst_vs_torch": min(ratios), "median_tune_s": round(statistics.median(r["tune_s"] for r in rows), 3)}


def table(rows: list[dict]) -> str:
    head = f"{'shape':<26} {'pick':<28} {'pick ms':>9} {'torch ms':>9} {'x torch':>8} {'tune s':>7}"
    return "\n".join([head, *(f"{r['name'][:26]:<26} {r['pick'][:28]:<28} {r['pick_ms']:>9.4f} {r['torch_ms']:>9.4f} "
                              f"{r['ratio_vs_torch']:>8.3f} {r['tune_s']:>7.2f}" for r in rows)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default=str(ROOT / "bench" / "shapes_cpu.json"),
                   help="suite file (default: bench/shapes_cpu.json)")
    p.add_argument("--only", default="", help="comma-separated shape names (default: every shape)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds per shape (default 15)")
    p.add_argument("--squares", default="", help="comma-separated sizes: square float32 mm problems, not a suite")
    p.add_argument("--busy", type=int, default=0, help="processes kept spinning beside each tune (default 0)")
    p.add_argument("--out", default="", help="JSON file, written after every shape")
    args = p.parse_args(argv)
    specs = [s for s in load_suite(args.suite) if not args.only or s.name in args.only.split(",")]
    if args.squares:
        specs = [ProblemSpec(int(n), int(n), int(n), name=f"square-{n}") for n in args.squares.split(",")]
    if not specs:
        p.error(f"no shape of {args.suite} is named in --only {args.only!r}")
    settings = gemmtune.Settings.from_env().with_(store="off")
    result = {"command": "python bench/cpu.py " + " ".join(sys.argv[1:] if argv is None else argv), "busy": args.busy,
              "device": cpu_name(), "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "gemmtune": gemmtune.__version__, "threads": torch.get_num_threads(), "shapes": []}
    for spec in specs:
        load = round(os.getloadavg()[0], 2)
        row = dict(run_shape(spec, args.rounds, settings, args.busy), load_avg_before=load)
        result["shapes"].append(row)
        result["summary"] = summary(result["shapes"])
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"{spec.name}: {row['pick']} x{row['ratio_vs_torch']:.3f} torch, tuned in {row['tune_s']:.2f} s",
              file=sys.stderr)
    print(table(result["shapes"]))
    s = result["summary"]
    print(f"\n{s['n']} shapes on {result['device']}: geomean {s['geomean_vs_torch']:.3f}x torch, "
          f"{s['library_picks']} library picks, median tune {s['median_tune_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
