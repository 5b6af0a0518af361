"""Where a patched eager forward spends host time that a plain one does not: profiles side by side.

Builds bench/models.py's stack at `--m` tokens twice (same weights), warms gemmtune up on one copy,
then for each copy: torch.profiler's per-op host time over `--iters` forwards (self CPU time by op
name, µs per forward) and cProfile's Python-level view.  Writes both tables to `--out` (JSON).

    python bench/eager_host_profile.py --m 64 --out host_profile.json
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402  (fresh cache directories, then torch)

torch, gemmtune = models.torch, models.gemmtune


def op_table(fn, iters: int) -> dict[str, float]:
    """Self CPU µs per forward by op name (torch.profiler, CPU activity only)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = {e.key: e.self_cpu_time_total / iters for e in p.key_averages()}
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]))


def py_table(fn, iters: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


def wall_us(fn, iters: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / iters


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", default="host_profile.json")
    args = p.parse_args(argv)
    base, inputs = models.build("stack", args.m)
    patched = copy.deepcopy(base)
    result: dict = {"m": args.m, "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name()}
    with torch.no_grad():
        gemmtune.warmup(patched, *inputs, progress=False, release=False)
        fns = {"plain": lambda: base(*inputs), "patched": lambda: patched(*inputs)}
        for fn in fns.values():
            for _ in range(5):
                fn()
        for name, fn in fns.items():
            result[name] = {"wall_us": [wall_us(fn, args.iters) for _ in range(3)],
                            "ops_us": op_table(fn, args.iters), "python": py_table(fn, args.iters)}
    for name in fns:
        print(f"== {name}: wall µs/forward {result[name]['wall_us']}")
        for op, us in list(result[name]["ops_us"].items())[:15]:
            print(f"  {us:8.1f}  {op}")
    print(result["patched"]["python"][:6000])
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
