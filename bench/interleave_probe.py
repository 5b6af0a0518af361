"""One choice's timer readings among 2 to 249 interleaved choices: does its host reading hold?

`CudaTimer.time_interleaved` (a tune's final, and `gemmtune sweep --rounds`) times every choice once
per round.  This script times one `torch._scaled_mm` (fp8, tensor-wise, 16x4096x4096; a bf16 mm where
fp8 is not supported) among `n - 1` bf16 mm fillers, for several `n`, and prints the probe's host and
GPU medians beside its own `CudaTimer.time` reading (the probe alone).  A GPU reading that grows with
`n` means the GPU waited for the host inside the events; a host reading that grows means the probe's
own call got slower among many others, and a cost of max(GPU, host) then ranks the context, not the
kernel.

    python bench/interleave_probe.py --out interleave_probe.json

GPU only; prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from gemmtune.measure.timers import CudaTimer  # noqa: E402

SHAPE = (16, 4096, 4096)  # M, K, N: a decode-sized projection, where host time decides


def probe_fn():
    """(name, fn): fp8 `torch._scaled_mm` where this GPU has it, else a bf16 mm."""
    m, k, n = SHAPE
    if torch.cuda.get_device_capability() >= (8, 9):
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        return "torch._scaled_mm", lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    return "torch.mm", lambda: torch.mm(a, b)


def fillers(count: int) -> list:
    """`count` bf16 mm calls of the probe's shape, over four weights."""
    m, k, n = SHAPE
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bs = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    return [lambda b=bs[i % 4]: torch.mm(a, b) for i in range(count)]


def us(m) -> dict:
    return {"host_us": m.host_ms * 1e3, "gpu_us": m.gpu_ms * 1e3, "cost_us": m.cost_ms * 1e3}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--choices", default="2,16,64,249", help="choices per interleaved call, the probe included")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", default="interleave_probe.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("interleave_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    timer = CudaTimer(torch.device("cuda"), rep_ms=10.0, min_reps=5, max_reps=50)
    name, fn = probe_fn()
    alone = us(timer.time(fn))
    rows = [{"choices": n, **us(timer.time_interleaved([fn] + fillers(n - 1), args.rounds)[0])}
            for n in (int(c) for c in args.choices.split(","))]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; probe {name} {'x'.join(map(str, SHAPE))}; "
          f"alone: host {alone['host_us']:.1f} us, GPU {alone['gpu_us']:.1f} us")
    print("| choices | host us | GPU us | cost us |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['choices']} | {r['host_us']:.1f} | {r['gpu_us']:.1f} | {r['cost_us']:.1f} |")
    out = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": datetime.date.today().isoformat(), "probe": name, "rounds": args.rounds,
                    "command": "bench/interleave_probe.py " + " ".join(sys.argv[1:])},
           "alone": alone, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
