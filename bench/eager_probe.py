"""Where a patched eager model spends host time: per-GEMM dispatch cost against torch, per pick.

Builds `bench/models.py`'s Llama-shaped stack at `--m` tokens, warms gemmtune up, then for each
distinct GEMM problem times back-to-back calls (µs per call, host wall clock over many calls with one
synchronize; on launch-bound shapes that is the host cost) of:
  torch      torch.mm / torch.addmm on the same operands
  gemmtune   gemmtune.mm / addmm (the eager API: dict lookup, then the winner)
  kernel     the Selection's kernel called directly (no dispatch dict)
and whether a Triton winner took its direct launch path (FastLaunch) or fell back to the JIT.
Then the whole forward: host µs per forward (no synchronize inside the loop), plain and patched.

    python bench/eager_probe.py --m 64 --out probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

import gemmtune  # noqa: E402
from gemmtune.dispatch import eager  # noqa: E402
from models import build  # noqa: E402


def per_call_us(fn, calls: int = 2000, rounds: int = 5) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def host_us(fn, calls: int = 100, rounds: int = 7) -> float:
    """Host time per call: wall clock over `calls` back-to-back calls, read before synchronizing
    (the launch queue does not fill in 100 calls, so the host never waits for the GPU)."""
    for _ in range(10):
        fn()
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def profile(fn) -> str:
    """torch.profiler's table (CPU and CUDA time per op) over 5 calls of `fn` after a warm-up."""
    from torch.profiler import ProfilerActivity, profile as prof

    fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    return p.key_averages().table(sort_by="cpu_time_total", row_limit=18, max_name_column_width=50)


def fast_launch_taken(sel, tensors) -> str:
    """'fast', 'jit' or '-' (library kernel): whether the winner's direct launch path (FastLaunch)
    served these operands (its __call__ returns False when the JIT has to launch)."""
    if sel.winner.is_extern:
        return "-"
    from gemmtune.templates.triton.launch import FastLaunch

    seen: list[bool] = []
    real = FastLaunch.__call__
    FastLaunch.__call__ = lambda self, args: seen.append(real(self, args)) or seen[-1]
    try:
        sel.kernel(*tensors)
        torch.cuda.synchronize()
    finally:
        FastLaunch.__call__ = real
    return "no FastLaunch" if not seen else ("fast" if all(seen) else "jit")


def per_problem(model) -> list[dict]:
    """Per tuned problem: torch's op, `gemmtune.mm` and the pick's kernel, per call and host time."""
    rows = []
    with torch.no_grad():
        for canon, sel in eager.selections().items():
            ops = [t for t in (torch.randn(*o.size, device="cuda", dtype=o.dtype) for o in sel.problem.operands)]
            layer = next(m for m in model.modules() if isinstance(m, torch.nn.Linear)
                         and tuple(m.weight.shape) == (sel.problem.N, sel.problem.K))
            a, b = ops[-2], layer.weight.t()
            row = {"problem": sel.problem.describe(), "winner": sel.winner.name,
                   "torch_us": per_call_us(lambda: torch.mm(a, b)),
                   "gemmtune_us": per_call_us(lambda: gemmtune.mm(a, b)),
                   "kernel_us": per_call_us(lambda: sel.kernel(a, b)),
                   "torch_host_us": host_us(lambda: torch.mm(a, b)),
                   "gemmtune_host_us": host_us(lambda: gemmtune.mm(a, b)),
                   "kernel_host_us": host_us(lambda: sel.kernel(a, b)),
                   "launch": fast_launch_taken(sel, (a, b))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--out", default="eager_probe.json")
    args = p.parse_args()
    model, (x,) = build("stack", args.m)
    with torch.no_grad():
        plain_fwd = host_us(lambda: model(x), calls=20)
        report = gemmtune.warmup(model, x, progress=False)
        patched_fwd = host_us(lambda: model(x), calls=20)
    patched_grad_fwd = host_us(lambda: model(x), calls=20)  # grad mode on: what a script without no_grad pays
    with torch.no_grad():
        before = gemmtune.dispatch_stats()
        patched_e2e = per_call_us(lambda: model(x), calls=20)
        after = gemmtune.dispatch_stats()
        profile_patched = profile(lambda: model(x))
    dispatch = {k: after[k] - before[k] for k in ("hits", "misses", "tunes")}
    gemmtune.unpatch(model)
    plain_grad_fwd = host_us(lambda: model(x), calls=20)
    with torch.no_grad():
        plain_e2e = per_call_us(lambda: model(x), calls=20)
        profile_plain = profile(lambda: model(x))
    rows = per_problem(model)
    result = {"M": args.m, "plain_forward_us": plain_fwd, "patched_forward_us": patched_fwd, "rows": rows,
              "plain_grad_forward_us": plain_grad_fwd, "patched_grad_forward_us": patched_grad_fwd,
              "warmup": report.table(), "plain_e2e_us": plain_e2e, "patched_e2e_us": patched_e2e,
              "dispatch_during_loop": dispatch, "profile_plain": profile_plain, "profile_patched": profile_patched}
    print("profile plain:\n" + profile_plain + "\nprofile patched:\n" + profile_patched)
    print(f"end to end us per forward (no_grad): plain {plain_e2e:.1f}, patched {patched_e2e:.1f}; "
          f"dispatch during the patched loop: {dispatch}")
    print(report.table())
    print(f"forward host us (no_grad): plain {plain_fwd:.1f}, patched {patched_fwd:.1f}; "
          f"(grad on): plain {plain_grad_fwd:.1f}, patched {patched_grad_fwd:.1f}")
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
