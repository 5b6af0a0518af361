"""Per GEMM: gemmtune against cuBLAS (cuBLASLt for fp8) and Inductor max-autotune, on a shape suite, in one
process on one GPU; tuning time beside each.

For every shape of `--suite` (bf16 `bench/shapes.json`, fp8 `bench/shapes_fp8.json`): the library call as is;
`torch.compile` of the op in mode max-autotune-no-cudagraphs on fresh caches; gemmtune's `tune`, store off, cold (a
fresh Triton cache) and warm; on misaligned shapes (`--compiled`), a default-mode compile under
`gemmtune.inductor.installed`; where N's rows are not whole 16 bytes, the pick for `out_layout="padded"` (columns
`padded_view_*`: the view of padded rows Inductor returns, B a frozen layer's weight: `as_weight`); with
`--exhaustive`, the exhaustive search.  The picks are timed interleaved (CUDA events, L2 flushed), then each once more
by the second timer (`gemmtune.measure.second`: Triton's do_bench), columns `*_second_ms`.  Writes JSON after every
shape.

    python bench/compare.py --suite bench/shapes_fp8.json --no-inductor --only llama3-8b-q_o-m16-rowwise
    python bench/compare.py --dry-run                     # no GPU: the plan, nothing timed
    python bench/compare.py --part 1/2 --out a.json       # (--part 2/2 on another GPU), then:
    python bench/compare.py --merge a.json b.json --out compare.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
INDUCTOR_MODE = "max-autotune-no-cudagraphs"


def load_specs(path: str | Path, only: Sequence[str] = ()):
    """The suite's ProblemSpecs, optionally restricted to names in `only`."""
    from gemmtune.offline.suite import load_suite
    specs = load_suite(path)
    if missing := sorted(set(only) - {s.name for s in specs}):
        raise SystemExit(f"--only: unknown shape(s) {', '.join(missing)}")
    return [s for s in specs if not only or s.name in only]


def spec_fields(spec) -> dict[str, Any]:
    """The shape's name, problem and dimensions: the first keys of its plan entry and its JSON row."""
    return {"name": spec.name, "problem": spec.describe(), "M": spec.M, "K": spec.K, "N": spec.N,
            "batch": spec.batch, "op": spec.op, "dtype": spec.dtype, "b_layout": spec.b_layout, "scales": spec.scales}


def build_plan(specs, exhaustive: set[str], inductor: bool = True, rounds: int = 30,
               compiled: str = "misaligned") -> list[dict[str, Any]]:
    """What will be measured for each shape, in order."""
    plan = []
    for spec in specs:
        steps = [f"cublas: {'torch._scaled_mm (cuBLASLt)' if spec.op == 'scaled_mm' else 'torch op'} as is",
                 "gemmtune: tune (store off), cold compile cache", "gemmtune: tune (store off), warm compile cache"]
        timed = ["gemmtune pick", "cublas"]
        if inductor:
            steps.append(f"inductor: torch.compile(mode={INDUCTOR_MODE!r}), fresh TORCHINDUCTOR_CACHE_DIR")
            timed.append("inductor pick")
        if inductor and compiled != "off":
            steps.append("gemmtune compiled: default-mode torch.compile under gemmtune.inductor.installed(), fresh "
                         f"caches{', if a dimension is misaligned' if compiled == 'misaligned' else ''}")
        if spec.name in exhaustive:
            steps.append("gemmtune: tune exhaustive (store off) -> regret of the default pick")
            timed.append("gemmtune exhaustive pick")
        steps.append(f"interleaved timing ({rounds} rounds): " + ", ".join(timed))
        plan.append({**spec_fields(spec), "steps": steps, "timed": timed})
    return plan


def op_fn(op: str) -> Callable:
    """The library call of `op`: cuBLAS through aten; for scaled_mm, `torch._scaled_mm` (cuBLASLt), bf16 out."""
    import torch
    if op == "scaled_mm":
        return lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    return {"mm": torch.mm, "addmm": torch.addmm, "bmm": torch.bmm}[op]


def as_weight(tensors: tuple) -> tuple:
    """`tensors` with B the weight of a frozen layer (`nn.Parameter`, no grad; `W.t()` where B is a column-major
    `W.t()`), as a patched model's head under `no_grad` passes it: its padded copy is kept, not made per call."""
    import torch
    b = tensors[-1]
    col = b.dim() == 2 and b.stride(0) == 1 and b.stride(1) != 1
    w = torch.nn.Parameter(b.mT if col else b, requires_grad=False)
    return (*tensors[:-1], w.mT if col else w)


def run_compiled(spec, tensors, settings=None) -> tuple[Callable, float, str]:
    """`torch.compile` of the op on fresh caches, first call timed: Inductor in `INDUCTOR_MODE`, or with `settings`,
    gemmtune's compiled path (default mode, `gemmtune.inductor.installed`; Inductor's padding too).  Call, seconds,
    and the choice each of Inductor's autotunes picked (its feedback hook: name, description, its time)."""
    import torch

    import gemmtune.inductor as gi
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    space: dict[str, Any] = {"fn": op_fn(spec.op)}  # a code object of its own: no compile replaces another's
    exec(compile("def call(*t):\n    return fn(*t)\n", f"<{spec.op} gemmtune={bool(settings)}>", "exec"), space)
    compiled = torch.compile(space["call"], mode=None if settings else INDUCTOR_MODE, dynamic=False, fullgraph=True)
    t0, picks = time.perf_counter(), []  # the import below counts, as it did when the compile made it
    from torch._inductor import select_algorithm as sa
    sa.add_feedback_saver(lambda timings, *_: timings and picks.append(min(timings.items(), key=lambda kv: kv[1])))
    try:
        with gi.installed(settings=settings) if settings else contextlib.nullcontext():
            compiled(*tensors)
            torch.cuda.synchronize()
    finally:
        sa.clear_feedback_savers()  # gemmtune's own saver (inductor.timed) registers again on its next lowering
    return compiled, time.perf_counter() - t0, "; ".join(f"{c.name} ({getattr(c, 'description', '')}) {ms:.4f} ms"
                                                          for c, ms in picks)


def run_exhaustive(spec, settings, tensors, row: dict[str, Any]) -> Callable[[], Any]:
    """The exhaustive tune: its pick, runs, best template and library time (as it timed them) into `row`; its call."""
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


def run_shape(spec, settings, timer, exhaustive: bool, inductor: bool, rounds: int, compiled: str) -> dict[str, Any]:
    """One shape: its tunes, Inductor's compile, gemmtune's compiled path (`compiled`: "all", or "misaligned"
    shapes only, or "off"), then every pick timed interleaved; its JSON row."""
    import torch

    import gemmtune
    from gemmtune.measure.second import second_reading, second_timer_for
    from gemmtune.core.layout import padded_row
    from gemmtune.templates.padded import padding_dims
    shape_t0, tensors, row = time.perf_counter(), spec.tensors("cuda"), spec_fields(spec)
    t0 = time.perf_counter()
    cold = gemmtune.tune(spec.op, *tensors, settings=settings)
    row["gemmtune_cold_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = gemmtune.tune(spec.op, *tensors, settings=settings)
    row["gemmtune_warm_s"] = time.perf_counter() - t0
    row.update(winner=cold.winner.key, winner_template=cold.winner.template_uid, warm_winner=warm.winner.key,
               n_choices=cold.n_choices, benchmark_runs=cold.benchmark_runs, compile_s=cold.compile_s,
               templates=sorted({t.choice.template_uid for t in cold.timings}))
    cublas = op_fn(spec.op)
    fns = {"gemmtune": lambda: cold(*tensors), "cublas": lambda: cublas(*tensors)}
    if inductor:
        by_inductor, row["inductor_tune_s"], row["inductor_pick"] = run_compiled(spec, tensors)
        fns["inductor"] = lambda: by_inductor(*tensors)
    row["misaligned"], ki = bool(padding_dims(cold.problem)), cold.problem
    if ki.op != "scaled_mm" and padded_row(ki.N, ki.result_dtype.itemsize) != ki.N:  # also Inductor's padded view
        held = as_weight(tensors)
        t0, view = time.perf_counter(), gemmtune.tune(spec.op, *held, settings=settings, out_layout="padded")
        row.update(padded_view_winner=view.winner.key, padded_view_tune_s=time.perf_counter() - t0)
        fns["padded_view"] = lambda: view(*held)
    if inductor and (compiled == "all" or (compiled == "misaligned" and row["misaligned"])):
        path, row["compiled_compile_s"], _ = run_compiled(spec, tensors, settings)
        fns["compiled"] = lambda: path(*tensors)
    if exhaustive:
        fns["exhaustive"] = run_exhaustive(spec, settings, tensors, row)
    measured = timer.time_interleaved(list(fns.values()), rounds)
    second = second_reading(list(fns.values()), second_timer_for(timer.flush), timer.device, rounds=5)
    for name, m, ms in zip(fns, measured, second):
        row[f"{name}_ms"], row[f"{name}_host_ms"], row[f"{name}_second_ms"] = m.cost_ms, m.host_ms, ms
    row.update(decided_by=cold.decided_by, pick_is_library=cold.winner.is_extern)
    row["speedup_vs_cublas"] = row["cublas_ms"] / row["gemmtune_ms"]
    if inductor:
        row["inductor_speedup_vs_cublas"] = row["cublas_ms"] / row["inductor_ms"]
    if exhaustive:
        same = row["exh_winner"] == row["winner"]
        row["regret_pct"] = 0.0 if same else 100 * (row["gemmtune_ms"] / row["exhaustive_ms"] - 1)
    del tensors
    torch.cuda.empty_cache()
    row["shape_wall_s"] = time.perf_counter() - shape_t0
    return row


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--suite", default=str(ROOT / "bench" / "shapes.json"))
    p.add_argument("--out", default="compare.json")
    p.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    p.add_argument("--exhaustive", default="", help="comma-separated shape names also tuned exhaustively")
    p.add_argument("--no-inductor", action="store_true", help="skip Inductor max-autotune")
    p.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds")
    p.add_argument("--compiled", choices=("off", "misaligned", "all"), default="misaligned",
                   help="also time gemmtune's compiled path (default-mode compile, install()) on these shapes")
    p.add_argument("--dry-run", action="store_true", help="parse the suite, print the plan, measure nothing")
    p.add_argument("--part", default="", help="K/N: only the K-th of N parts of the suite (one per GPU; then --merge)")
    p.add_argument("--merge", nargs="+", default=[], metavar="JSON", help="join the parts into --out")
    args = p.parse_args(argv)
    if not args.dry_run:  # before anything imports or compiles with Triton
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    if args.merge:
        return merge(args)
    names = lambda text: [s for s in text.split(",") if s]  # noqa: E731
    specs = load_specs(args.suite, names(args.only))
    if args.part:
        k, n = (int(x) for x in args.part.split("/"))
        if not 1 <= k <= n:
            raise SystemExit(f"--part: expected K/N with 1 <= K <= N, got {args.part!r}")
        specs = specs[(k - 1) * -(-len(specs) // n): k * -(-len(specs) // n)]
    exhaustive = set(names(args.exhaustive))
    if unknown := sorted(exhaustive - {s.name for s in load_specs(args.suite)}):
        raise SystemExit(f"--exhaustive: shape(s) not in the run: {', '.join(unknown)}")
    exhaustive &= {s.name for s in specs}
    if not args.dry_run:
        return measure(specs, exhaustive, args)
    plan = build_plan(specs, exhaustive, inductor=not args.no_inductor, rounds=args.rounds, compiled=args.compiled)
    print(f"{len(plan)} shapes, {sum(len(entry['timed']) for entry in plan)} timed kernels")
    for entry in plan:
        print(f"- {entry['name']}: {entry['problem']}\n" + "\n".join(f"    {step}" for step in entry["steps"]))
    if args.out:
        Path(args.out).write_text(json.dumps({"dry_run": True, "plan": plan}, indent=1))
    return 0


def measure(specs, exhaustive: set[str], args: argparse.Namespace) -> int:
    """Tune and time every shape on the GPU, writing the JSON after each; then the table and summary."""
    import gemmtune
    import torch
    from gemmtune.core.settings import Settings
    from gemmtune.measure.timers import CudaTimer
    if not torch.cuda.is_available():
        raise SystemExit("compare.py measures on a CUDA GPU; use --dry-run elsewhere")
    settings = Settings.from_env().with_(store="off")
    torch._dynamo.config.recompile_limit = torch._dynamo.config.accumulated_recompile_limit = 4 * len(specs) + 16
    timer = CudaTimer(torch.device("cuda"), rep_ms=50, count_host=False, flush=settings.l2_flush)
    meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__, "gemmtune": gemmtune.__version__,
            "python": platform.python_version(), "command": " ".join(sys.argv), "inductor_mode": INDUCTOR_MODE,
            "timing": f"GPU ms by CUDA events, L2 evicted by {settings.l2_flush}ing a 2x-L2 buffer, interleaved; "
                      "*_host_ms: host time per call", "l2_flush": settings.l2_flush,
            "settings": repr(settings)}  # every knob, GEMMTUNE_* variables included (a store's secrets hidden)
    rows = []
    for spec in specs:
        rows.append(row := run_shape(spec, settings, timer, spec.name in exhaustive, not args.no_inductor,
                                     args.rounds, args.compiled))
        print(f"{spec.name}: gemmtune {row['winner']} {row['gemmtune_ms']:.4f} ms (x{row['speedup_vs_cublas']:.3f}), "
              f"cuBLAS {row['cublas_ms']:.4f} ms, Inductor {row.get('inductor_ms', float('nan')):.4f} ms; "
              f"tune {row['gemmtune_cold_s']:.1f}/{row['gemmtune_warm_s']:.1f} s", flush=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    print(f"\n{markdown(rows, meta)}\n{json.dumps(summary(rows), indent=1)}")
    return 0


def merge(args: argparse.Namespace) -> int:
    """Join parts measured at once on several GPUs of one host; rows keep the suite's order."""
    parts = [json.loads(Path(p).read_text()) for p in args.merge]
    order = {s.name: i for i, s in enumerate(load_specs(args.suite))}
    rows = sorted((r for part in parts for r in part["rows"]), key=lambda r: order.get(r["name"], len(order)))
    meta = dict(parts[0]["meta"], parts=[p["meta"].get("command") for p in parts])
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary(rows)}, indent=1, default=str))
    print(f"\n{markdown(rows, meta)}\n{json.dumps(summary(rows), indent=1)}")
    return 0


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The rows as a Markdown table (and the exhaustive searches' regret, where measured)."""
    out = [f"{meta.get('device')}, torch {meta.get('torch')}, triton {meta.get('triton')}, {meta.get('date')}", "",
           "| shape | problem | cuBLAS ms | gemmtune pick | ms | x cuBLAS | Inductor ms | x cuBLAS | "
           "tune s cold | warm | Inductor s | choices |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ind, ind_s = r.get("inductor_ms"), r.get("inductor_tune_s")
        out.append(f"| {r['name']} | {r['problem']} | {r['cublas_ms']:.4f} | `{r['winner']}` | {r['gemmtune_ms']:.4f} "
                   f"| {r['speedup_vs_cublas']:.3f} | {'-' if ind is None else f'{ind:.4f}'} | "
                   f"{'-' if ind is None else format(r['inductor_speedup_vs_cublas'], '.3f')} | "
                   f"{r['gemmtune_cold_s']:.1f} | {r['gemmtune_warm_s']:.1f} | "
                   f"{'-' if ind_s is None else format(ind_s, '.1f')} | {r['n_choices']} |")
    if ex := [r for r in rows if "exh_winner" in r]:
        out += ["", "| shape | default pick | exhaustive pick | regret % | runs | exhaustive runs |", "|---" * 6 + "|"]
        out += [f"| {r['name']} | `{r['winner']}` | `{r['exh_winner']}` | {r['regret_pct']:.2f} | "
                f"{r['benchmark_runs']} | {r['exh_runs']} |" for r in ex]
    return "\n".join(out)


def geomean(xs: Sequence[float | None]) -> float | None:
    """The geometric mean of the values given (None and 0 left out).

        >>> geomean([1.0, 4.0, None])
        2.0
    """
    kept = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in kept) / len(kept)) if kept else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the tuning times; the picks against cuBLAS and against the best of the kernels timed."""
    cold, warm = (statistics.median(r[f"gemmtune_{k}_s"] for r in rows) for k in ("cold", "warm"))
    ind = [r["inductor_tune_s"] for r in rows if r.get("inductor_tune_s") is not None]
    out: dict[str, Any] = {"shapes": len(rows), "median_cold_s": cold, "median_warm_s": warm}
    if ind:
        mi = statistics.median(ind)
        out.update(median_inductor_s=mi, cold_vs_inductor=cold / mi, warm_vs_inductor=warm / mi)
    best = [r["gemmtune_ms"] / min(x for x in (r["cublas_ms"], r.get("inductor_ms"), r.get("exhaustive_ms")) if x)
            for r in rows]
    out.update(within_1pct_of_best=sum(b <= 1.01 for b in best) / len(rows), worst_vs_best=max(best),
               worst_vs_cublas=max(r["gemmtune_ms"] / r["cublas_ms"] for r in rows),
               over_1_02_cublas=[r["name"] for r in rows if r["gemmtune_ms"] > 1.02 * r["cublas_ms"]],
               over_1_02_cublas_second=[r["name"] for r in rows if not r.get("pick_is_library") and r.get(
                   "gemmtune_second_ms", 0) > 1.02 * r.get("cublas_second_ms", math.inf)],
               misaligned_vs_inductor={r["name"]: r["inductor_ms"] / r["gemmtune_ms"] for r in rows
                                       if r.get("misaligned") and r.get("inductor_ms")},
               compiled_vs_inductor={r["name"]: r["inductor_ms"] / r["compiled_ms"] for r in rows
                                     if r.get("compiled_ms") and r.get("inductor_ms")},
               geomean_speedup=geomean([r["speedup_vs_cublas"] for r in rows]),
               inductor_geomean_speedup=geomean([r.get("inductor_speedup_vs_cublas") for r in rows]))
    lib = {r["name"]: r["exh_library_ms"] / r["exh_best_template_ms"] for r in rows if r.get("exh_best_template_ms")}
    return dict(out, best_template_vs_library=lib) if lib else out


if __name__ == "__main__":
    sys.exit(main())
