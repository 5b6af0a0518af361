"""Where gemmtune's time goes: a tune's wall time by stage, and the per-call cost of a tuned GEMM in eager
code and inside a `torch.compile`d function, each against torch's own op.

`tune`: per suite shape, a cold tune (fresh Triton cache, store off), a warm one and a warm one in-process
(`isolation="off"`), each by stage (compile, prescreen, final), then cProfile of a warm tune.  `calls`: µs
per call of a warm `gemmtune.mm` against `torch.mm` in interleaved rounds of back-to-back calls (small
shapes: the host's cost; large: the kernel's), then of `relu(mm(a, b))` under `torch.compile` with each,
and whether the compiled program still calls a gemmtune op.  `dynamic`: µs per call of an `mm` compiled with
a dynamic M, by Inductor alone and with gemmtune's per-bucket dispatch.  Writes JSON with `--out`.

    python bench/profiling.py tune --suite bench/shapes_cpu.json --only square-128 --out tune_profile.json
    python bench/profiling.py calls --device cpu --shapes 8,64,256x512x128 --out calls.json
    python bench/profiling.py dynamic --out dynamic.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(p) for p in (ROOT / "bench", ROOT / "src") if str(p) not in sys.path]
SHAPES = {"cuda": "1,16,16x4096x6144,1x4096x14336,4096", "cpu": "8,64,256"}
DYNAMIC = {"cuda": "2x256x256,2x4096x4096,16x4096x14336", "cpu": "4x64x64"}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'1,16,256x512x128' -> (M, K, N) triples; a single number N is NxNxN.

        >>> parse_shapes("2,4x8x16")
        [(2, 2, 2), (4, 8, 16)]
    """
    dims = [[int(d) for d in part.lower().split("x")] for part in text.split(",") if part]
    return [tuple(d * 3 if len(d) == 1 else d) for d in dims]


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tune_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`tune`: every shape's tunes by stage and the cProfile of a warm one."""
    import torch

    from gemmtune.core.settings import Settings
    from gemmtune.engine import tune
    from gemmtune.offline.suite import load_suite
    specs = [s for s in load_suite(args.suite) if not args.only or s.name in args.only.split(",")]
    base = Settings.from_env().with_(store="off")
    t0 = time.perf_counter()  # the isolation worker starts once a process: on a throwaway problem first
    x = torch.randn(64, 64, device=args.device)
    tune("mm", x, x, settings=base.with_(backends=("extern",)))
    print(f"worker start and a first library-only tune: {time.perf_counter() - t0:.2f} s", flush=True)
    rows = []
    for spec in specs:
        tensors, row = spec.tensors(args.device), {"name": spec.name, "problem": spec.describe()}
        for label, settings in (("cold", base), ("warm", base), ("warm_inprocess", base.with_(isolation="off"))):
            _sync(args.device)
            t0 = time.perf_counter()
            sel = tune(spec.op, *tensors, settings=settings)
            row[label] = {"wall_s": round(time.perf_counter() - t0, 4), "tuning_s": round(sel.tuning_s, 4),
                          "compile_s": round(sel.compile_s, 4), "prescreen_s": round(sel.prescreen_s, 4),
                          "final_s": round(sel.benchmark_s, 4), "runs": sel.benchmark_runs, "winner": sel.winner.name,
                          "binaries": len(sel.binary_seconds or {})}
        prof, text = cProfile.Profile(), io.StringIO()
        prof.runcall(tune, spec.op, *tensors, settings=base)
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(35)
        row["profile"] = text.getvalue()
        print(f"-- {spec.name}: a warm tune, cProfile\n{row['profile']}", flush=True)
        rows.append(row)
    print("| shape | tune | wall s | compile s | prescreen s | final s | runs | binaries | winner |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        for label in ("cold", "warm", "warm_inprocess"):
            print("| {} | {} | {wall_s:.3f} | {compile_s:.3f} | {prescreen_s:.3f} | {final_s:.3f} | {runs} | "
                  "{binaries} | {winner} |".format(r["name"], label, **r[label]))
    return rows


def per_call_us(fn: Callable[[], Any], device: str, rounds: int, round_s: float = 0.05) -> float:
    """µs per call: the median of `rounds` rounds of back-to-back calls (~`round_s` each, one synchronize each)."""
    def seconds(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync(device)
        return time.perf_counter() - t0

    seconds(10)  # warm-up
    calls = max(10, min(200_000, int(round_s / max(seconds(1), 1e-7))))
    return statistics.median(seconds(calls) / calls * 1e6 for _ in range(rounds))


def calls_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`calls`: per shape, µs per call of warm `gemmtune.mm` and `torch.mm`, eager and in a compiled `relu(mm)`."""
    import torch
    from torch._inductor.utils import run_and_get_code

    import gemmtune
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    rows = []
    for m, k, n in parse_shapes(args.shapes or SHAPES[args.device.split(":")[0]]):
        a = torch.randn(m, k, device=args.device, dtype=dtype)
        b = torch.randn(n, k, device=args.device, dtype=dtype).t()  # nn.Linear's weight layout
        eager = {"torch": lambda: torch.mm(a, b), "gemmtune": lambda: gemmtune.mm(a, b)}
        t0 = time.perf_counter()
        row: dict[str, Any] = {"shape": f"{m}x{k}x{n}", "winner": gemmtune.tune("mm", a, b).winner.name,
                               "tune_s": time.perf_counter() - t0}
        got: dict[str, list] = {name: [] for name in eager}
        for _ in range(args.rounds):  # interleaved: the host's drift hits both alike
            for name, fn in eager.items():
                got[name].append(per_call_us(fn, args.device, 1))
        row.update({f"{name}_mm_us": statistics.median(v) for name, v in got.items()})
        torch._dynamo.reset()
        fns = {"torch": lambda a, b: torch.relu(torch.mm(a, b)), "gemmtune": lambda a, b: torch.relu(gemmtune.mm(a, b))}
        compiled = {name: torch.compile(fn, fullgraph=True) for name, fn in fns.items()}
        row["gemmtune_op_in_code"] = "torch.ops.gemmtune" in "\n".join(run_and_get_code(compiled["gemmtune"], a, b)[1])
        for name, fn in compiled.items():
            row[f"compiled_{name}_us"] = per_call_us(lambda: fn(a, b), args.device, args.rounds)
        rows.append(row)
    print("| shape | torch.mm µs | gemmtune.mm µs | compiled: torch.mm µs | gemmtune.mm µs | gemmtune op | pick |")
    print("|---|---:|---:|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['torch_mm_us']:.2f} | {r['gemmtune_mm_us']:.2f} | {r['compiled_torch_us']:.2f} | "
              f"{r['compiled_gemmtune_us']:.2f} | {r['gemmtune_op_in_code']} | {r['winner']} |")
    return rows


def dynamic_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`dynamic`: per shape, µs per call of a `torch.compile(dynamic=True)` linear layer at M (traced at 2M): the
    default mode and max-autotune-no-cudagraphs against gemmtune's bucketed call (`install(m=1:4M)`), its picks
    any kernel or the library's (`gemmtune_library`), each compiled once, then timed in shuffled rounds;
    `dispatch_us`: the per-round paired difference, library picks less default (what the dispatch adds)."""
    import torch

    import gemmtune.inductor as gi
    from gemmtune.core.settings import Settings
    from gemmtune.inductor import dynamic
    from model_runs import own_frame

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    variants = {"default": ("default", None), "max_autotune": ("max-autotune-no-cudagraphs", None),
                "gemmtune": ("default", Settings.from_env()),
                "gemmtune_library": ("default", Settings.from_env().with_(backends=("extern",)))}
    rows, rng, shapes = [], random.Random(0), parse_shapes(args.shapes or DYNAMIC[args.device.split(":")[0]])
    if any(m < 2 for m, _, _ in shapes):  # traced at 2M, dynamic; a call at M = 1 gets a static graph of its own
        raise SystemExit("profiling.py dynamic: M must be at least 2")
    for m, k, n in shapes:
        a = torch.randn(m, k, device=args.device, dtype=dtype)
        layer = torch.nn.Linear(k, n, bias=False, device=args.device, dtype=dtype)  # a weight: N and K fixed
        row, fns, times = {"shape": f"{m}x{k}x{n}"}, {}, {name: [] for name in variants}
        for name, (mode, settings) in variants.items():
            dynamic.reset()
            handler = gi.install(m=f"1:{4 * m}", settings=settings) if settings is not None else None
            try:
                torch._dynamo.mark_dynamic(traced := torch.randn(2 * m, k, device=args.device, dtype=dtype), 0)
                fns[name] = torch.compile(own_frame(layer, f"{name} {m}"), mode=mode, dynamic=True)
                with torch.no_grad():
                    fns[name](traced), fns[name](a)
            finally:
                if handler is not None:
                    gi.uninstall()
            if handler is not None:  # the bucket tables its compile tuned, and the kernels built for calls' sizes
                row.update({f"{name}_picks": [dynamic.parse_table(t)[3] for t in handler.tables.values()],
                            f"{name}_buckets": dict(dynamic.STATS)})
        with torch.no_grad():
            for _ in range(args.rounds):  # interleaved: the host's drift hits every variant alike
                for name in rng.sample(list(fns), len(fns)):
                    times[name].append(per_call_us(lambda: fns[name](a), args.device, 1))
        row.update({f"{name}_us": statistics.median(t) for name, t in times.items()},
                   dispatch_us=statistics.median(x - y for x, y in zip(times["gemmtune_library"], times["default"])))
        rows.append(row)
    print("| shape | " + " | ".join(f"{v} µs" for v in variants) + " | dispatch µs |\n|---" + "|---:" * 5 + "|")
    for r in rows:
        print(f"| {r['shape']} | " + " | ".join(f"{r[v + '_us']:.2f}" for v in variants) + f" | {r['dispatch_us']:+.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = p.add_subparsers(dest="what", required=True)
    kinds = {"tune": sub.add_parser("tune", help="a tune's wall time by stage, and cProfile of a warm tune"),
             "calls": sub.add_parser("calls", help="µs per call of gemmtune.mm against torch.mm, eager and compiled"),
             "dynamic": sub.add_parser("dynamic", help="µs per call of a dynamic-M compiled mm, gemmtune's buckets and not")}
    for q in kinds.values():
        q.add_argument("--device", default=None, help="cuda or cpu (default: cuda if there is one)")
        q.add_argument("--out", default=None, help="write the rows as JSON here")
    kinds["tune"].add_argument("--suite", default=str(ROOT / "bench" / "shapes.json"))
    kinds["tune"].add_argument("--only", default="", help="comma-separated shape names (default: all)")
    for q in (kinds["calls"], kinds["dynamic"]):
        q.add_argument("--shapes", default=None, help="N (NxNxN) or MxKxN, comma-separated")
        q.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):  # a cold start
        os.environ.setdefault(var, tempfile.mkdtemp(prefix="profile-"))
    os.environ.setdefault("GEMMTUNE_STORE", "memory")  # tune afresh, leave the user's store alone
    import torch
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = {"tune": tune_rows, "calls": calls_rows, "dynamic": dynamic_rows}[args.what](args)
    if args.out:
        meta = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "torch": torch.__version__,
                "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
