"""gemmtune vs cuBLAS vs Inductor max-autotune, side by side, in one process on one GPU.

For every shape of a suite:

1. cuBLAS: `torch.mm` / `torch.addmm` / `torch.bmm` as they are.
2. Inductor max-autotune DEFAULT: `torch.compile(mode="max-autotune-no-cudagraphs")` of a function
   doing the op, with fresh caches (`TORCHINDUCTOR_CACHE_DIR` a new temp dir, `torch._dynamo.reset()`
   per shape); its compile + tune wall time, its choice count and pick (from Inductor's feedback hook).
3. gemmtune: `tune()` with the store off, twice: the first call is "cold" (this process compiles;
   Triton's on-disk cache is a fresh temp dir unless `--keep-triton-cache`), the second "warm"
   (binaries cached in memory and on disk, nothing remembered by a store).
4. gemmtune exhaustive (store off) for the shapes named with `--exhaustive`: prescreen's regret.

The picks are then timed interleaved (`CudaTimer.time_interleaved`: L2 flushed before every run,
CUDA events, rotated order; GPU time and host time both recorded).  Writes JSON after every shape,
prints a markdown table, and with `--plot PREFIX` draws `PREFIX_speedup.png` (speedup over cuBLAS
per shape) and `PREFIX_tuning.png` (tuning wall time vs Inductor) if matplotlib is installed.

    python bench/compare.py --suite bench/shapes.json --out compare.json --plot compare \\
        --exhaustive square-2048,llama3-8b-down-m16
    python bench/compare.py --dry-run          # CPU: parse the suite, print the plan, time nothing
    python bench/compare.py --suite bench/shapes_fp8.json   # fp8 scaled_mm; the library: torch._scaled_mm
    # two GPUs of one host at once, then one table:
    CUDA_VISIBLE_DEVICES=0 python bench/compare.py --part 1/2 --out a.json & \
    CUDA_VISIBLE_DEVICES=1 python bench/compare.py --part 2/2 --out b.json; wait
    python bench/compare.py --merge a.json b.json --out compare.json --plot compare

Example (no GPU needed):
    >>> import importlib.util, pathlib
    >>> spec = importlib.util.spec_from_file_location("compare", pathlib.Path("bench/compare.py"))
    >>> compare = importlib.util.module_from_spec(spec); spec.loader.exec_module(compare)  # doctest: +SKIP
    >>> len(compare.build_plan(compare.load_specs("bench/shapes.json"), {"square-2048"})) # doctest: +SKIP
    24
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from compare_report import markdown, plot, summary  # noqa: E402  (re-exported: compare.markdown, ...)

INDUCTOR_MODE = "max-autotune-no-cudagraphs"


# -- the plan (no GPU needed) ----------------------------------------------------------------------

def load_specs(path: str | Path, only: Sequence[str] = ()):
    """The suite's ProblemSpecs, optionally restricted to names in `only`."""
    from gemmtune.offline.suite import load_suite

    specs = load_suite(path)
    if only:
        missing = sorted(set(only) - {s.name for s in specs})
        if missing:
            raise SystemExit(f"--only: unknown shape(s) {', '.join(missing)}")
        specs = [s for s in specs if s.name in set(only)]
    return specs


def build_plan(specs, exhaustive: set[str], inductor: bool = True, rounds: int = 30) -> list[dict[str, Any]]:
    """What will be measured for each shape, in order."""
    plan = []
    for spec in specs:
        steps = [f"cublas: {'torch._scaled_mm (cuBLASLt)' if spec.op == 'scaled_mm' else 'torch op'} as is",
                 "gemmtune: tune (store off), cold compile cache",
                 "gemmtune: tune (store off), warm compile cache"]
        timed = ["gemmtune pick", "cublas"]
        if inductor:
            steps.append(f"inductor: torch.compile(mode={INDUCTOR_MODE!r}), fresh TORCHINDUCTOR_CACHE_DIR, dynamo reset")
            timed.append("inductor pick")
        if spec.name in exhaustive:
            steps.append("gemmtune: tune exhaustive (store off) -> regret of the default pick")
            timed.append("gemmtune exhaustive pick")
        steps.append(f"interleaved timing ({rounds} rounds): " + ", ".join(timed))
        plan.append({"name": spec.name, "problem": spec.describe(), "op": spec.op, "M": spec.M, "K": spec.K,
                     "N": spec.N, "batch": spec.batch, "dtype": spec.dtype, "b_layout": spec.b_layout,
                     "scales": spec.scales, "steps": steps, "timed": timed})
    return plan


def print_plan(plan: list[dict[str, Any]]) -> None:
    print(f"{len(plan)} shapes, {sum(len(p['timed']) for p in plan)} timed kernels")
    for p in plan:
        print(f"- {p['name']}: {p['problem']}")
        for step in p["steps"]:
            print(f"    {step}")


# -- measurements (GPU) ----------------------------------------------------------------------------

def op_fn(op: str) -> Callable:
    """The library call of `op`: cuBLAS through aten; for scaled_mm, `torch._scaled_mm` (cuBLASLt), bf16 out."""
    import torch

    if op == "scaled_mm":
        return lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    return {"mm": torch.mm, "addmm": torch.addmm, "bmm": torch.bmm}[op]


def run_inductor(spec, tensors) -> tuple[Callable, dict[str, Any]]:
    """Compile + autotune with Inductor max-autotune on fresh caches; return the compiled fn and facts."""
    import torch

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    torch._dynamo.reset()
    seen: dict[str, Any] = {}
    try:  # Inductor's feedback hook reports every autotuned choice's time (torch >= 2.6)
        from torch._inductor import select_algorithm

        def saver(timings, *rest):  # (timings, name, input_nodes, choices, ...): the tail varies by version
            if timings:
                best = min(timings.items(), key=lambda kv: kv[1])
                seen.update(choices=len(timings), pick=getattr(best[0], "name", str(best[0])),
                            pick_desc=getattr(best[0], "description", ""), pick_ms=float(best[1]))

        select_algorithm.add_feedback_saver(saver)
    except (ImportError, AttributeError):
        saver = None
    fn = op_fn(spec.op)
    compiled = torch.compile(lambda *t: fn(*t), mode=INDUCTOR_MODE, dynamic=False, fullgraph=True)
    t0 = time.perf_counter()
    compiled(*tensors)
    torch.cuda.synchronize()
    seen["tune_s"] = time.perf_counter() - t0
    if saver is not None and hasattr(select_algorithm, "clear_feedback_savers"):
        select_algorithm.clear_feedback_savers()
    return compiled, seen


def best_by_template(timings) -> dict[str, float]:
    """The fastest time each template reached inside one tune (the tuner's own timer: the ratio of two
    of them compares them under one timer), over the candidates that ran correctly."""
    best: dict[str, float] = {}
    for t in timings:
        if t.ms is not None and t.status == "ok":
            uid = t.choice.template_uid
            best[uid] = min(best.get(uid, t.ms), t.ms)
    return best


def run_exhaustive(spec, settings, tensors, row: dict[str, Any]) -> Callable[[], Any]:
    """gemmtune's exhaustive tune of the shape: its pick and runs into `row`, and its best generated
    kernel against the library kernel as both timed inside that tune; returns the pick's call."""
    import gemmtune

    t0 = time.perf_counter()
    exh = gemmtune.tune(spec.op, *tensors, settings=settings.with_(strategy="exhaustive"))
    row.update(exh_winner=exh.winner.key, exh_tune_s=time.perf_counter() - t0, exh_runs=exh.benchmark_runs,
               exh_choices=exh.n_choices)
    timed = [t for t in exh.timings if t.ms is not None]
    best_t = min((t for t in timed if not t.choice.is_extern), key=lambda t: t.ms, default=None)
    lib = min((t for t in timed if t.choice.is_extern), key=lambda t: t.ms, default=None)
    if best_t is not None and lib is not None:
        row.update(exh_best_template=best_t.choice.key, exh_best_template_ms=best_t.ms, exh_library_ms=lib.ms)
    return lambda: exh(*tensors)


def run_shape(spec, settings, timer, exhaustive: bool, inductor: bool, rounds: int,
              timer_other=None) -> dict[str, Any]:
    import torch

    import gemmtune

    shape_t0 = time.perf_counter()
    tensors = spec.tensors("cuda")
    row: dict[str, Any] = {"name": spec.name, "problem": spec.describe(), "M": spec.M, "K": spec.K, "N": spec.N,
                           "batch": spec.batch, "op": spec.op, "dtype": spec.dtype, "b_layout": spec.b_layout,
                           "scales": spec.scales}
    t0 = time.perf_counter()
    cold = gemmtune.tune(spec.op, *tensors, settings=settings)
    row["gemmtune_cold_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = gemmtune.tune(spec.op, *tensors, settings=settings)
    row["gemmtune_warm_s"] = time.perf_counter() - t0
    row.update(winner=cold.winner.key, winner_template=cold.winner.template_uid, warm_winner=warm.winner.key,
               n_choices=cold.n_choices, benchmark_runs=cold.benchmark_runs, compile_s=cold.compile_s,
               templates=sorted({t.choice.template_uid for t in cold.timings}),
               best_ms_by_template=best_by_template(cold.timings))
    cublas = op_fn(spec.op)
    fns = {"gemmtune": lambda: cold(*tensors), "cublas": lambda: cublas(*tensors)}
    if inductor:
        compiled, facts = run_inductor(spec, tensors)
        row.update({f"inductor_{k}": v for k, v in facts.items()})
        fns["inductor"] = lambda: compiled(*tensors)
    if exhaustive:
        fns["exhaustive"] = run_exhaustive(spec, settings, tensors, row)
    measured = timer.time_interleaved(list(fns.values()), rounds)
    for name, m in zip(fns, measured):
        row[f"{name}_ms"], row[f"{name}_host_ms"] = m.cost_ms, m.host_ms
    row["speedup_vs_cublas"] = row["cublas_ms"] / row["gemmtune_ms"]
    if timer_other is not None:
        for name, m in zip(fns, timer_other.time_interleaved(list(fns.values()), rounds)):
            row[f"{name}_ms_{timer_other.flush}"] = m.cost_ms
        row[f"speedup_vs_cublas_{timer_other.flush}"] = (row[f"cublas_ms_{timer_other.flush}"]
                                                         / row[f"gemmtune_ms_{timer_other.flush}"])
    if inductor:
        row["inductor_speedup_vs_cublas"] = row["cublas_ms"] / row["inductor_ms"]
    if exhaustive:
        same = row["exh_winner"] == row["winner"]
        row["regret_pct"] = 0.0 if same else 100 * (row["gemmtune_ms"] / row["exhaustive_ms"] - 1)
    del tensors
    torch.cuda.empty_cache()
    row["shape_wall_s"] = time.perf_counter() - shape_t0
    return row


# -- main ---------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default=str(ROOT / "bench" / "shapes.json"))
    p.add_argument("--out", default="compare.json")
    p.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    p.add_argument("--exhaustive", default="", help="comma-separated shape names also tuned exhaustively")
    p.add_argument("--no-inductor", action="store_true", help="skip Inductor max-autotune")
    p.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds")
    p.add_argument("--strategy", default=None, help="gemmtune strategy (default: Settings default)")
    p.add_argument("--effort", default=None, help="gemmtune effort level, if this gemmtune has one")
    p.add_argument("--keep-triton-cache", action="store_true", help="do not point TRITON_CACHE_DIR at a fresh dir")
    p.add_argument("--plot", default="", help="write PREFIX_speedup.png and PREFIX_tuning.png")
    p.add_argument("--dry-run", action="store_true", help="parse the suite, print the plan, measure nothing")
    p.add_argument("--part", default="", help="K/N: measure only the K-th of N contiguous parts of the suite "
                   "(run the parts on N GPUs at once, then --merge)")
    p.add_argument("--merge", nargs="+", default=[], metavar="JSON",
                   help="merge the JSON of several parts: print the table and summary, write --out and --plot")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not args.keep_triton_cache:  # before anything imports or compiles with Triton
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    if args.merge:
        return merge(args)
    names = lambda text: [s for s in text.split(",") if s]  # noqa: E731
    specs = load_specs(args.suite, names(args.only))
    if args.part:
        k, n = (int(x) for x in args.part.split("/"))
        if not 1 <= k <= n:
            raise SystemExit(f"--part: expected K/N with 1 <= K <= N, got {args.part!r}")
        size = -(-len(specs) // n)
        specs = specs[(k - 1) * size: k * size]
    exhaustive = set(names(args.exhaustive))
    unknown = sorted(exhaustive - {s.name for s in load_specs(args.suite)})
    exhaustive &= {s.name for s in specs}
    if unknown:
        raise SystemExit(f"--exhaustive: shape(s) not in the run: {', '.join(unknown)}")
    plan = build_plan(specs, exhaustive, inductor=not args.no_inductor, rounds=args.rounds)
    if args.dry_run:
        print_plan(plan)
        if args.out:
            Path(args.out).write_text(json.dumps({"dry_run": True, "plan": plan}, indent=1))
        return 0

    return measure(specs, exhaustive, args)


def measure(specs, exhaustive: set[str], args: argparse.Namespace) -> int:
    """Tune and time every shape on the GPU, writing the JSON after each; then the table and summary."""
    import torch

    import gemmtune
    from gemmtune.core.settings import Settings
    from gemmtune.measure.timers import CudaTimer

    if not torch.cuda.is_available():
        raise SystemExit("compare.py measures on a CUDA GPU; use --dry-run elsewhere")
    extra = {k: v for k, v in (("strategy", args.strategy), ("effort", args.effort)) if v is not None}
    settings = Settings.from_env().with_(store="off", **extra)
    timer = CudaTimer(torch.device("cuda"), rep_ms=50, count_host=False, flush=settings.l2_flush)
    # The same picks once more with L2 left dirty (Triton do_bench's flush), for comparison.
    other = "write" if settings.l2_flush == "read" else "read"
    timer_other = CudaTimer(torch.device("cuda"), rep_ms=50, count_host=False, flush=other)
    meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__, "gemmtune": gemmtune.__version__,
            "python": platform.python_version(), "command": " ".join(sys.argv), "inductor_mode": INDUCTOR_MODE,
            "timing": f"GPU ms by CUDA events, L2 evicted by {settings.l2_flush}ing a 2x-L2 buffer, interleaved; "
                      f"*_ms_{other}: the same with the {other} flush; *_host_ms: host time per call",
            "l2_flush": settings.l2_flush}
    rows = []
    for spec in specs:
        row = run_shape(spec, settings, timer, spec.name in exhaustive, not args.no_inductor, args.rounds,
                        timer_other)
        rows.append(row)
        print(f"{spec.name}: gemmtune {row['winner']} {row['gemmtune_ms']:.4f} ms (x{row['speedup_vs_cublas']:.3f}), "
              f"cuBLAS {row['cublas_ms']:.4f} ms, Inductor {row.get('inductor_ms', float('nan')):.4f} ms; "
              f"tune {row['gemmtune_cold_s']:.1f}/{row['gemmtune_warm_s']:.1f} s", flush=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    print()
    print(markdown(rows, meta))
    print(json.dumps(summary(rows), indent=1))
    if args.plot:
        for path in plot(rows, args.plot):
            print(f"wrote {path}")
    return 0


def merge(args: argparse.Namespace) -> int:
    """Join parts measured at once on several GPUs of one host; rows keep the suite's order."""
    parts = [json.loads(Path(p).read_text()) for p in args.merge]
    order = {s.name: i for i, s in enumerate(load_specs(args.suite))}
    rows = sorted((r for part in parts for r in part["rows"]), key=lambda r: order.get(r["name"], len(order)))
    meta = dict(parts[0]["meta"], parts=[p["meta"].get("command") for p in parts])
    out = {"meta": meta, "rows": rows, "summary": summary(rows)}
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(markdown(rows, meta))
    print(json.dumps(out["summary"], indent=1))
    if args.plot:
        for path in plot(rows, args.plot):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
