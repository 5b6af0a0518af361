"""Host overhead of the eager API: µs per call of `gemmtune.mm` (warm) vs `torch.mm`.

For each shape the problem is tuned first (not timed); then both functions
are timed in alternating rounds of many back-to-back calls, and the median
round is reported.  On CUDA each round is bracketed by torch.cuda.synchronize
(host wall clock per call) and by CUDA events (GPU time per call).  On tiny
shapes the per-call time is the host overhead of the call; on large ones it
is the kernel's time.

    python bench/dispatch_overhead.py                     # cuda if available, else cpu
    python bench/dispatch_overhead.py --device cpu --out bench/results/dispatch_cpu.json
    python bench/dispatch_overhead.py --shapes 1,16,256x4096x1024 --backends extern

Prints a markdown table: shape, torch.mm µs, gemmtune.mm µs, ratio, winner, and for a Triton
winner the same kernel launched without gemmtune (arguments built once, a fresh output per call):
through Triton's JIT (`kernel[grid](...)`) and through the binary's own launcher; plus GPU µs
columns on CUDA (kernel time per call, back to back).  Writes the rows as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gemmtune.dispatch import eager as api  # noqa: E402
from gemmtune.core.inputs import parse_dtype  # noqa: E402

GPU_SHAPES = "1,2,4,8,16,64,256,1024,4096"
CPU_SHAPES = "1,2,4,8,16,64,256,1024"  # 4096^3 fp32 takes seconds per call (and minutes to tune) on a CPU


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'1,16,256x512x128' -> [(1,1,1), (16,16,16), (256,512,128)] as (M, K, N)."""
    out = []
    for part in text.split(","):
        dims = [int(d) for d in part.lower().split("x")]
        out.append(tuple(dims * 3) if len(dims) == 1 else tuple(dims))
    return out


def _loop(fn, a, b, n: int, backends) -> None:
    """n back-to-back calls, written as a user would call (no wrapper frame around gemmtune.mm)."""
    if backends is None:
        for _ in range(n):
            fn(a, b)
    else:
        for _ in range(n):
            fn(a, b, backends=backends)


def _round(fn, a, b, n: int, cuda: bool, backends=None) -> tuple[float, float | None]:
    """(host wall µs per call, GPU µs per call or None) for n back-to-back calls.

    Host: synchronize, n calls, synchronize; wall clock / n.  GPU: a sleep
    kernel is queued first, long enough for the host to enqueue every call
    behind it, so the events around the calls time the kernels back to back
    without host gaps (at most 400 calls: the launch queue is finite).
    """
    if not cuda:
        t0 = time.perf_counter()
        _loop(fn, a, b, n, backends)
        return (time.perf_counter() - t0) / n * 1e6, None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    _loop(fn, a, b, n, backends)
    torch.cuda.synchronize()
    host = (time.perf_counter() - t0) / n * 1e6
    k = min(n, 400)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(min(2e8, host * k * 1e-6 * 2e9 * 1.5 + 1e5)))  # ~2 GHz, 1.5x margin
    start.record()
    _loop(fn, a, b, k, backends)
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) * 1e3 / k


def measure(M: int, K: int, N: int, *, device: str, dtype: torch.dtype, backends, rounds: int,
            round_s: float) -> dict:
    a = torch.randn(M, K, device=device, dtype=dtype)
    b = torch.randn(K, N, device=device, dtype=dtype)
    cuda = device.startswith("cuda")

    mm = api.mm  # what `gemmtune.mm` is

    t0 = time.perf_counter()
    mm(a, b, backends=backends)  # tunes (or loads from the store)
    tune_s = time.perf_counter() - t0
    _round(torch.mm, a, b, 3, cuda)  # warm-up
    _round(mm, a, b, 3, cuda, backends)
    # calls per round: enough for round_s of the slower function
    probe = max(_round(torch.mm, a, b, 3, cuda)[0], _round(mm, a, b, 3, cuda, backends)[0])
    n = max(1, min(200_000, int(round_s * 1e6 / max(probe, 1e-3))))
    sel = next((s for k, s in api.selections().items()
                if k[0] == a.shape and k[4] == b.shape and k[2] == a.dtype), None)
    direct = _direct_launches(sel, a, b) if cuda and sel is not None else {}  # the winner's kernel without gemmtune
    rows: dict[str, list[tuple[float, float | None]]] = {"torch": [], "gemmtune": [], **{k: [] for k in direct}}
    for _ in range(rounds):  # interleaved: the host's drift hits every variant alike
        rows["torch"].append(_round(torch.mm, a, b, n, cuda))
        rows["gemmtune"].append(_round(mm, a, b, n, cuda, backends))
        for name, fn in direct.items():
            rows[name].append(_round(fn, a, b, n, cuda))
    torch_us = statistics.median(h for h, _ in rows["torch"])
    gt_us = statistics.median(h for h, _ in rows["gemmtune"])
    row = {"shape": f"{M}x{K}x{N}", "M": M, "K": K, "N": N, "calls_per_round": n, "rounds": rounds,
           "torch_mm_us": torch_us, "gemmtune_mm_us": gt_us, "ratio": gt_us / torch_us,
           "winner": sel.winner.name if sel is not None else "?", "tune_s": tune_s}
    if cuda:
        row["torch_mm_gpu_us"] = statistics.median(g for _, g in rows["torch"])
        row["gemmtune_mm_gpu_us"] = statistics.median(g for _, g in rows["gemmtune"])
    for name in direct:
        row[f"{name}_us"] = statistics.median(h for h, _ in rows[name])
    return row


def _direct_launches(sel, a: torch.Tensor, b: torch.Tensor) -> dict:
    """The winner's kernel launched as a Triton user would, arguments built once, a fresh output per
    call: `jit` through `kernel[grid](...)`, `direct` through the compiled binary's own launcher
    (gemmtune's FastLaunch).  Empty for library winners and templates without a single-kernel spec."""
    from gemmtune.templates.registry import default_templates

    template = next((t for t in default_templates() if t.uid == sel.winner.template_uid), None)
    try:
        run, make_args = template.launch_spec(sel.winner, sel.problem)
    except (AttributeError, NotImplementedError):
        return {}
    out = torch.empty(sel.problem.out_size, dtype=a.dtype, device=a.device)
    args = make_args((a, b), out, **sel.winner.runtime_dict)
    run = run.warmed(args)
    size, dtype, device, empty = sel.problem.out_size, a.dtype, a.device, torch.empty
    at = [i for i, x in enumerate(args) if x is out]

    def with_fresh_out(launch):
        def call(a, b):
            o = empty(size, dtype=dtype, device=device)
            full = list(args)
            for i in at:
                full[i] = o
            launch(full)
            return o
        return call

    jit = with_fresh_out(lambda full: run.kernel[run.grid](*full, **run.meta))
    return {"triton_jit": jit} if run.fast is None else {"triton_jit": jit, "direct": with_fresh_out(run.fast)}


def table(rows: list[dict], cuda: bool) -> str:
    head = "| shape (MxKxN) | torch.mm µs | gemmtune.mm µs | ratio | winner | Triton JIT launch µs | direct launch µs |"
    sep = "|---|---:|---:|---:|---|---:|---:|"
    if cuda:
        head += " torch.mm GPU µs | gemmtune.mm GPU µs |"
        sep += "---:|---:|"
    lines = [head, sep]
    for r in rows:
        jit, direct = (f"{r[k]:.2f}" if k in r else "-" for k in ("triton_jit_us", "direct_us"))
        line = (f"| {r['shape']} | {r['torch_mm_us']:.2f} | {r['gemmtune_mm_us']:.2f} | {r['ratio']:.2f}x "
                f"| {r['winner']} | {jit} | {direct} |")
        if cuda:
            line += f" {r['torch_mm_gpu_us']:.2f} | {r['gemmtune_mm_gpu_us']:.2f} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--shapes", default=None, help=f"comma list of N (NxNxN) or MxKxN; default cuda: {GPU_SHAPES}, "
                                                 f"cpu: {CPU_SHAPES}")
    p.add_argument("--backends", default=None, help="comma list of families (default: the device's defaults)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--round-ms", type=float, default=50.0, help="target length of one timed round")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (cpu; 0: leave)")
    p.add_argument("--store", default="memory",
                   help="GEMMTUNE_STORE for this run (default 'memory': tune afresh, ignore earlier picks)")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)

    os.environ["GEMMTUNE_STORE"] = args.store
    cuda = args.device.startswith("cuda")
    dtype = parse_dtype(args.dtype) if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    backends = tuple(args.backends.split(",")) if args.backends else None
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = parse_shapes(args.shapes or (GPU_SHAPES if cuda else CPU_SHAPES))
    rows = []
    for M, K, N in shapes:
        row = measure(M, K, N, device=args.device, dtype=dtype, backends=backends, rounds=args.rounds,
                      round_s=args.round_ms / 1e3)
        rows.append(row)
        print(f"  {row['shape']}: torch.mm {row['torch_mm_us']:.2f} µs, gemmtune.mm {row['gemmtune_mm_us']:.2f} µs "
              f"({row['ratio']:.2f}x, {row['winner']}, tuned in {row['tune_s']:.1f} s)", file=sys.stderr)
    dev_name = (torch.cuda.get_device_name(torch.device(args.device)) if cuda
                else platform.processor() or platform.machine())
    print(f"\ngemmtune.mm (warm) vs torch.mm, {args.device} ({dev_name}), {str(dtype).replace('torch.', '')}, "
          f"backends={backends or 'default'}, torch {torch.__version__}\n")
    print(table(rows, cuda))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "device": args.device, "device_name": dev_name, "dtype": str(dtype), "backends": backends,
            "torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
            "rows": rows}, indent=2))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
