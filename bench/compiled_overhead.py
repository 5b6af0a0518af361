"""Per-call cost of gemmtune inside compiled programs: `torch.compile` of a function doing one GEMM
with `gemmtune.mm` against the same function with `torch.mm`, and both eager, in one process.

Each function is `relu(mm(a, b))` (one pointwise op, so Inductor has something to fuse).  Calls are
timed back to back in rounds (host wall clock, one synchronize per round; median round): on small
shapes this is the host cost per call, on large ones the kernel's time.  Also prints what the
compiled gemmtune program runs (the pick, and whether its generated code still calls a gemmtune op).

    python bench/compiled_overhead.py                          # cuda if available, else cpu
    python bench/compiled_overhead.py --device cpu --shapes 8x8x8,64x64x64 --out compiled_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

import gemmtune  # noqa: E402
from gemmtune.dispatch import compiled  # noqa: E402

GPU_SHAPES = "16x4096x6144,64x4096x4096,1x4096x14336,4096x4096x4096"
CPU_SHAPES = "8x8x8,64x64x64,256x256x256"


def per_call_us(fn, rounds: int = 7, round_s: float = 0.05) -> float:
    for _ in range(10):
        fn()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    calls = max(10, int(round_s / max(time.perf_counter() - t0, 1e-7)))
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def measure(shape: tuple[int, int, int], device: str, dtype: torch.dtype) -> dict:
    m, k, n = shape
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(n, k, device=device, dtype=dtype).t()  # nn.Linear's weight layout
    plain = lambda a, b: torch.relu(torch.mm(a, b))  # noqa: E731
    tuned = lambda a, b: torch.relu(gemmtune.mm(a, b))  # noqa: E731
    torch._dynamo.reset()
    gemmtune.clear_dispatch_cache()
    c_plain, c_tuned = torch.compile(plain, fullgraph=True), torch.compile(tuned, fullgraph=True)
    from torch._inductor.utils import run_and_get_code

    out, code = run_and_get_code(c_tuned, a, b)
    ref = plain(a, b)
    err = float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))
    row = {"shape": f"{m}x{k}x{n}", "device": device, "dtype": str(dtype).replace("torch.", ""),
           "compiled_torch_us": per_call_us(lambda: c_plain(a, b)),
           "compiled_gemmtune_us": per_call_us(lambda: c_tuned(a, b)),
           "eager_torch_us": per_call_us(lambda: plain(a, b)),
           "eager_gemmtune_us": per_call_us(lambda: tuned(a, b)),
           "opaque_op_in_code": "torch.ops.gemmtune" in "\n".join(code), "rel_err": err,
           "traced_pick": next((d[0].winner.name for d in compiled._TRACED.values() if d), None)}
    row["compiled_ratio"] = row["compiled_gemmtune_us"] / row["compiled_torch_us"]
    row["compiled_extra_us"] = row["compiled_gemmtune_us"] - row["compiled_torch_us"]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shapes", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    shapes = args.shapes or (GPU_SHAPES if args.device == "cuda" else CPU_SHAPES)
    rows = [measure(tuple(int(v) for v in s.split("x")), args.device, dtype) for s in shapes.split(",")]
    print("| shape | compiled torch.mm us | compiled gemmtune.mm us | ratio | extra us | eager torch | eager gemmtune "
          "| opaque op in code | rel err | traced pick |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['compiled_torch_us']:.1f} | {r['compiled_gemmtune_us']:.1f} | "
              f"{r['compiled_ratio']:.3f} | {r['compiled_extra_us']:+.1f} | {r['eager_torch_us']:.1f} | "
              f"{r['eager_gemmtune_us']:.1f} | {r['opaque_op_in_code']} | {r['rel_err']:.1e} | {r['traced_pick']} |")
    if args.out:
        meta = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "command": " ".join(sys.argv),
                "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
