"""What one `CudaTimer.time` call costs, and where: the L2 flush, the host path, the reps.

    python bench/timer_probe.py --out timer_probe.json

Prints GPU microseconds per flush (read and write), host microseconds per timed run, and the wall
time of `CudaTimer.time` on a 2048^3 bf16 mm and a 1x4096x4096 GEMV at a few rep budgets, with the
median each gives; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))


def gpu_us(fn, n: int = 50) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / n


def flush_variants(dev, nbytes: int) -> dict:
    """Read-flush variants: GPU us per flush, and cuBLAS 1x4096x6144 (50 MB of weight, memory-bound)
    timed after each: an evicting flush leaves it at DRAM speed."""
    import torch

    f32 = torch.zeros(nbytes // 4, device=dev)
    i32 = torch.zeros(nbytes // 4, device=dev, dtype=torch.int32)
    bf = torch.zeros(nbytes // 2, device=dev, dtype=torch.bfloat16)
    s32, s64 = torch.zeros((), device=dev), torch.zeros((), device=dev, dtype=torch.int64)
    variants = {
        "none": lambda: None,
        "write_zero": lambda: i32.zero_(),
        "sum_i32_to_i64": lambda: torch.sum(i32, dim=0, dtype=torch.int64, out=s64),
        "sum_f32": lambda: torch.sum(f32, dim=0, out=s32),
        "amax_f32": lambda: torch.amax(f32, dim=0, out=s32),
        "sum_bf16_f32": lambda: torch.sum(bf, dim=0, dtype=torch.float32, out=s32),
        "sum_f32_2d": lambda: torch.sum(f32.view(-1, 4096), dim=(0, 1), out=s32),
    }
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(6144, 4096, device=dev, dtype=torch.bfloat16).t()
    y = torch.empty(1, 6144, device=dev, dtype=torch.bfloat16)
    res = {}
    for vname, vf in variants.items():
        us = gpu_us(vf) if vname != "none" else 0.0
        samples = []
        for _ in range(200):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            vf()
            s.record()
            torch.mm(x, w, out=y)
            e.record()
            samples.append((s, e))
        torch.cuda.synchronize()
        after = statistics.median(s.elapsed_time(e) for s, e in samples)
        res[f"variant_{vname}"] = {"flush_us": round(us, 2), "qkv_m1_after_ms": round(after, 5)}
        print(vname, res[f"variant_{vname}"], flush=True)
    return res


def timer_settings(dev, name: str, fn) -> dict:
    """One case: its kernel time, the timer's host time per run, and the timer's wall time and spread
    at four (rep_ms, max_reps) settings."""
    import torch

    from gemmtune.measure.timers import CudaTimer

    res = {f"{name}_kernel_us": round(gpu_us(fn), 2)}
    t = CudaTimer(dev)
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(100):
        t._one(fn, k)
    res[f"{name}_host_us_per_run"] = round((time.perf_counter() - t0) * 1e4, 2)
    torch.cuda.synchronize()
    for rep_ms, max_reps in ((10.0, 100), (3.0, 100), (3.0, 30), (10.0, 30)):
        walls, meds = [], []
        for _ in range(5):
            t = CudaTimer(dev, rep_ms=rep_ms, max_reps=max_reps)
            t0 = time.perf_counter()
            measured = t.time(fn)
            walls.append((time.perf_counter() - t0) * 1e3)
            meds.append(measured.gpu_ms)
        res[f"{name}_rep{rep_ms:g}_max{max_reps}"] = {
            "wall_ms": round(statistics.median(walls), 2),
            "gpu_ms_median": round(statistics.median(meds), 5),
            "gpu_ms_spread_pct": round((max(meds) - min(meds)) / statistics.median(meds) * 100, 2)}
    print(name, res, flush=True)
    return res


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="timer_probe.json")
    args = p.parse_args()
    import torch

    from gemmtune.measure.timers import CudaTimer

    dev = torch.device("cuda")
    res: dict = {"device": torch.cuda.get_device_name()}
    for flush in ("read", "write"):
        t = CudaTimer(dev, flush=flush)
        res[f"flush_{flush}_us"] = round(gpu_us(t._evict), 2)
        res["flush_bytes"] = t._flush.numel() * 4
    res.update(flush_variants(dev, res["flush_bytes"]))
    cases = {
        "mm_2048": (torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16),
                    torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)),
        "gemv_o_m1": (torch.randn(1, 4096, device=dev, dtype=torch.bfloat16),
                      torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16).t()),
    }
    for name, (a, b) in cases.items():
        out = torch.empty(a.shape[0], b.shape[1], device=dev, dtype=a.dtype)
        res.update(timer_settings(dev, name, lambda a=a, b=b, out=out: torch.mm(a, b, out=out)))
    print(res, flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
