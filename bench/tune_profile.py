"""Where a tune's wall time goes, on one GPU: compile, prescreen, final, and the rest.

For each shape: a cold tune (fresh Triton cache at process start, store off), a warm tune, a warm
tune measured in-process (`isolation="off"`), and cProfile of a warm tune (the caller's side) with
the top entries by cumulative time.  Also times, per binary, a second `Template.compile` (what an
isolation worker pays to load a binary the caller compiled) and one `CudaTimer.time` call.

    python bench/tune_profile.py --only square-2048,llama3-8b-o-m1 --out profile.json

Prints one line per tune and the profiles; writes JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))


def _fields(sel, wall: float) -> dict:
    return {"wall_s": round(wall, 4), "tuning_s": round(sel.tuning_s, 4), "compile_s": round(sel.compile_s, 4),
            "prescreen_s": round(sel.prescreen_s, 4), "final_s": round(sel.benchmark_s, 4),
            "runs": sel.benchmark_runs, "winner": sel.winner.name,
            "binaries": len(sel.binary_seconds or {})}


def profiled(spec, tensors, settings, top: int) -> dict:
    """A warm tune under cProfile: its wall seconds and the top entries by cumulative time."""
    from gemmtune.engine import tune

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    sel = tune(spec.op, *tensors, settings=settings)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(top)
    print(s.getvalue(), flush=True)
    return {"warm_profiled_s": round(time.perf_counter() - t0, 4), "profile": s.getvalue(), "selection": sel}


def reloads(spec, tensors, sel, settings) -> dict:
    """What loading a compiled binary again costs (an isolation worker does this per binary), and one
    `CudaTimer.time` call, for up to six of the tune's binaries."""
    import torch

    from gemmtune.core.inputs import KernelInputs
    from gemmtune.measure.timers import CudaTimer
    from gemmtune.templates import active_templates

    ki = KernelInputs.from_tensors(spec.op, *tensors)
    by_uid = {t.uid: t for t in active_templates(ki, None, None, True, "default", False)}
    timer = CudaTimer(torch.device("cuda"), rep_ms=settings.gpu_rep_ms)
    loads, times = [], []
    for t in sel.timings:
        if t.ms is None or t.choice.is_extern or len(loads) >= 6:
            continue
        t1 = time.perf_counter()
        launch = by_uid[t.choice.template_uid].compile(t.choice, ki, tensors)
        loads.append(time.perf_counter() - t1)
        out = torch.empty(ki.out_size, dtype=ki.dtype, device="cuda")
        rt = t.choice.runtime_dict
        t1 = time.perf_counter()
        timer.time(lambda: launch(tensors, out, **rt))
        times.append(time.perf_counter() - t1)
    row = {"reload_ms": [round(v * 1e3, 2) for v in loads], "timer_time_ms": [round(v * 1e3, 2) for v in times]}
    print(spec.name, "reload ms", row["reload_ms"], "timer.time ms", row["timer_time_ms"], flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="bench/shapes.json")
    p.add_argument("--only", default="square-2048,llama3-8b-o-m1,llama3-8b-qkv-m16")
    p.add_argument("--out", default="tune_profile.json")
    p.add_argument("--top", type=int, default=35)
    args = p.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-profile-"))

    import torch

    import gemmtune
    from gemmtune.core.settings import Settings
    from gemmtune.engine import tune
    from gemmtune.offline.suite import load_suite

    names = [s for s in args.only.split(",") if s]
    specs = [s for s in load_suite(args.suite) if s.name in names]
    base = Settings.from_env().with_(store="off")
    rows = []
    # Worker start is paid once per process; pay it on a throwaway problem first.
    t0 = time.perf_counter()
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    tune("mm", x, x, settings=base.with_(backends=("extern",)))
    print(f"worker start + first extern-only tune: {time.perf_counter() - t0:.2f} s", flush=True)
    for spec in specs:
        tensors = spec.tensors("cuda")
        row: dict = {"name": spec.name}
        for label, st in (("cold", base), ("warm", base), ("warm_inprocess", base.with_(isolation="off"))):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            sel = tune(spec.op, *tensors, settings=st)
            row[label] = _fields(sel, time.perf_counter() - t0)
            print(spec.name, label, row[label], flush=True)
        prof = profiled(spec, tensors, base, args.top)
        sel = prof.pop("selection")
        row.update(prof)
        row.update(reloads(spec, tensors, sel, base))
        rows.append(row)
        Path(args.out).write_text(json.dumps({"gemmtune": gemmtune.__version__,
                                              "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
