"""nvidia-cutlass-operators' GEMMs (the `cutlass_operators` template) against cuBLAS, per operator.

For each shape (bench/shapes.json names) and each operator the library offers: JIT compile seconds,
run time by CUDA events (back-to-back launches through the template's launcher) cross-checked with
`triton.testing.do_bench`, and cuBLAS (`torch.mm`) with the same timers.  The library has no runtime
parameter; what stands in for the runtime-param cost check: the launcher's host cost per call (it
builds `GemmArguments` per call, against the same arguments kept), and with `--orders` the best operator
recompiled with each tile order the kernel class fixes at trace time (swizzle x raster, set on the
operator's `impl` before compiling: not a public parameter of the library) to show what a runtime
order would be worth.  Prints a table and writes JSON.

    python bench/cutlass_operators.py --dry-run             # what would run (no GPU needed)
    python bench/cutlass_operators.py --out ops.json        # the GPU machine: bench/gpu_run.py cutlass-ops-bench
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SHAPES = "square-4096,odd-4097,llama3-8b-qkv-m4096,llama3-8b-o-m4096,llama3-8b-gate_up-m4096,square-8192"
ORDERS = [(s, r) for s in (1, 2, 4, 8) for r in ("m", "n")]


def load_shapes(names: str) -> list[dict]:
    suite = {s["name"]: s for s in json.loads((ROOT / "bench" / "shapes.json").read_text())["shapes"]}
    unknown = [n for n in names.split(",") if n not in suite]
    if unknown:
        raise SystemExit(f"cutlass_operators.py: unknown shape {', '.join(unknown)} (see bench/shapes.json)")
    return [suite[n] for n in names.split(",")]


def tensors_of(shape: dict) -> tuple[torch.Tensor, ...]:
    M, K, N, dtype = shape["M"], shape["K"], shape["N"], getattr(torch, shape["dtype"])
    a = torch.randn(M, K, dtype=dtype, device="cuda")
    b = torch.randn(N, K, dtype=dtype, device="cuda").t() if shape["b_layout"] == "col" else \
        torch.randn(K, N, dtype=dtype, device="cuda")
    return a, b


def events_ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def host_us(fn, reps: int = 200) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


def time_both(fn, reps: int) -> dict:
    from triton.testing import do_bench

    return {"events_ms": events_ms(fn, reps), "do_bench_ms": do_bench(fn, warmup=25, rep=100)}


def bench_operator(template, choice, ki, x, out, reps: int) -> dict:
    """One operator: compile seconds, error against float32, both timers; an operator that fails says why."""
    t0 = time.perf_counter()
    try:
        row = measure_operator(template, choice, ki, x, out, reps)
    except Exception as exc:  # noqa: BLE001 - one operator's failure is a result, not the end of the run
        row = {"config": dict(choice.config), "error": f"{type(exc).__name__}: {exc}"[:300],
               "compile_s": time.perf_counter() - t0, "events_ms": float("inf")}
    print(f"  {choice.key}: " + (row.get("error") or f"{row['events_ms']:.4f} ms (do_bench {row['do_bench_ms']:.4f}), "
                                 f"compile {row['compile_s']:.1f} s, rel err {row['max_rel_err']:.2e}"), flush=True)
    return row


def measure_operator(template, choice, ki, x, out, reps: int) -> dict:
    t0 = time.perf_counter()
    launch = template.compile(choice, ki, x)
    row = {"config": dict(choice.config), "compile_s": time.perf_counter() - t0}
    launch(x, out)
    torch.cuda.synchronize()
    ref = (x[0].float() @ x[1].float())
    row["max_rel_err"] = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    row.update(time_both(lambda: launch(x, out), reps))
    return row


def order_rows(template, choice, ki, x, out, reps: int) -> list[dict]:
    """The best operator recompiled at each tile order (set on its `impl` before compiling)."""
    from gemmtune.templates.cutlass import launch as launch_mod
    from gemmtune.templates.cutlass import operators_lib

    rows = []
    for swizzle, raster in ORDERS:
        op = next(o for o in operators_lib.operators(template.library, ki, template.target())[0]
                  if operators_lib.matches(o, choice.config_dict))
        op.impl.swizzle_size, op.impl.raster_along_m = swizzle, raster == "m"
        fn = launch_mod.launcher(template.library, op, {**choice.config_dict, "order": f"{raster}{swizzle}"}, ki, x,
                                 (template.src_hash or "") + "-order", template.target())
        rows.append({"swizzle": swizzle, "raster": raster, **time_both(lambda: fn(x, out), reps)})
    return rows


def bench_shape(shape: dict, reps: int, orders: bool, limit: int | None) -> dict:
    from gemmtune.core.inputs import KernelInputs
    from gemmtune.templates.cutlass import operators_lib
    from gemmtune.templates.cutlass.operators import CutlassOperatorsTemplate

    x = tensors_of(shape)
    ki = KernelInputs.from_tensors("mm", *x)
    out = torch.empty(ki.out_size, dtype=ki.dtype, device="cuda")
    template = CutlassOperatorsTemplate(size="max")  # every operator, the shortlist of large problems too
    choices = template.configs(ki)[:limit]
    result = {"shape": shape["name"], "cublas": time_both(lambda: torch.mm(*x, out=out), reps),
              "operators": [bench_operator(template, c, ki, x, out, reps) for c in choices]}
    if all("error" in o for o in result["operators"]):
        return result
    best = min(range(len(choices)), key=lambda i: result["operators"][i]["events_ms"])
    launch = template.compile(choices[best], ki, x)
    op = template._operator(ki, choices[best].config_dict)
    lib = template.library
    kept = operators_lib.gemm_arguments(lib, *x, out)
    result["host_us"] = {"launcher": host_us(lambda: launch(x, out)),  # builds the arguments per call
                         "arguments_kept": host_us(lambda: op.run(kept, launch_artifact(launch),
                                                                  assume_supported_args=True)),
                         "torch_mm": host_us(lambda: torch.mm(*x, out=out))}
    if orders:
        result["orders"] = order_rows(template, choices[best], ki, x, out, reps)
    return result


def launch_artifact(launch):
    """The compiled artifact a launcher closes over (for the per-call-arguments host cost)."""
    cells = dict(zip(launch.__code__.co_freevars, (c.cell_contents for c in launch.__closure__ or ())))
    return cells["artifact"]


def table(results: list[dict]) -> str:
    rows = ["| shape | cuBLAS ms | best operator ms (events / do_bench) | cuBLAS / best | its config | compile s (sum) |",
            "|---|---|---|---|---|---|"]
    for r in results:
        best = min(r["operators"], key=lambda o: o["events_ms"])
        if "error" in best:
            rows.append(f"| {r['shape']} | {r['cublas']['events_ms']:.4f} | every operator failed: {best['error']} |")
            continue
        cfg = best["config"]
        rows.append(f"| {r['shape']} | {r['cublas']['events_ms']:.4f} | {best['events_ms']:.4f} / "
                    f"{best['do_bench_ms']:.4f} | {r['cublas']['events_ms'] / best['events_ms']:.3f} | "
                    f"{cfg['operator']} {cfg['tile_m']}x{cfg['tile_n']}x{cfg['tile_k']} c{cfg['cluster_m']}x{cfg['cluster_n']} | "
                    f"{sum(o['compile_s'] for o in r['operators']):.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"bench/shapes.json names (default {DEFAULT_SHAPES})")
    p.add_argument("--reps", type=int, default=50, help="back-to-back launches per CUDA-event timing (default 50)")
    p.add_argument("--limit", type=int, default=None, help="at most this many operators per shape")
    p.add_argument("--no-orders", action="store_true", help="skip recompiling the best operator at each tile order")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--dry-run", action="store_true", help="print what would run; needs no GPU")
    args = p.parse_args(argv)
    shapes = load_shapes(args.shapes)
    if args.dry_run:
        for s in shapes:
            print(f"{s['name']}: mm {s['M']}x{s['K']}x{s['N']} {s['dtype']} B {s['b_layout']}: every operator of "
                  f"get_operators ({'at most %d' % args.limit if args.limit else 'all'}), cuBLAS, host cost"
                  + ("" if args.no_orders else f", best operator at {len(ORDERS)} tile orders"))
        return 0
    if not torch.cuda.is_available():
        print("cutlass_operators.py: needs a CUDA GPU (try --dry-run)", file=sys.stderr)
        return 2
    results = []
    for s in shapes:  # the JSON is rewritten after every shape: a run cut short keeps what it measured
        print(f"{s['name']}:", flush=True)
        results.append(bench_shape(s, args.reps, not args.no_orders, args.limit))
        if args.out:
            Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                  "results": results}, indent=1, default=str))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
