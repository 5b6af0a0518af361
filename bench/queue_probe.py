"""Does the interleaved timer's host reading hold with many choices?  The launch queue, measured.

`CudaTimer.time_interleaved` times every choice once per round.  The GPU runs behind the host by
design (a spin kernel covers each batch of runs), so without a synchronise between batches the host
gets ever further ahead, the device's launch queue fills, and each launch then waits for a free slot:
that wait lands inside the timed call and reads as the choice's host time.  This script times one
`torch._scaled_mm` (fp8, tensor-wise, 16x4096x4096; a bf16 mm where fp8 is not supported) among
`n - 1` bf16 mm fillers, for several `n`, with the timer's batch size (`QUEUE_RUNS`) as shipped and
with batching off (the timer before batching), and prints the probe's host and GPU medians beside its
own `CudaTimer.time` reading (one choice alone: the queue never fills).

    python bench/queue_probe.py --out queue_probe.json

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

from gemmtune.measure import timers  # noqa: E402

UNBATCHED = 10 ** 9  # QUEUE_RUNS for "no synchronise between batches"


def probe_fn(m: int, k: int, n: int):
    """(name, fn): fp8 `torch._scaled_mm` where this GPU has it, else a bf16 mm."""
    dev = "cuda"
    if torch.cuda.get_device_capability() >= (8, 9):
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        return "torch._scaled_mm", lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    a, b = torch.randn(m, k, device=dev, dtype=torch.bfloat16), torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    return "torch.mm", lambda: torch.mm(a, b)


def fillers(count: int, m: int, k: int, n: int) -> list:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bs = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    return [lambda b=bs[i % 4]: torch.mm(a, b) for i in range(count)]


def reading(timer, fns: list, rounds: int, batch: int) -> dict:
    timers.QUEUE_RUNS = batch
    m = timer.time_interleaved(fns, rounds)[0]
    return {"host_us": m.host_ms * 1e3, "gpu_us": m.gpu_ms * 1e3, "cost_us": m.cost_ms * 1e3}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--choices", default="2,16,64,249", help="choices per interleaved call, the probe included")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", default="queue_probe.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("queue_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    shipped = timers.QUEUE_RUNS
    timer = timers.CudaTimer(torch.device("cuda"), rep_ms=10.0, min_reps=5, max_reps=50)
    name, fn = probe_fn(16, 4096, 4096)
    alone = timer.time(fn)
    rows = []
    for count in (int(c) for c in args.choices.split(",")):
        fns = [fn] + fillers(count - 1, 16, 4096, 4096)
        for label, batch in (("batched", shipped), ("unbatched", UNBATCHED)):
            rows.append({"choices": count, "timer": label, "queue_runs": batch,
                         **reading(timer, fns, args.rounds, batch)})
    timers.QUEUE_RUNS = shipped
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; probe {name} 16x4096x4096; "
          f"alone (CudaTimer.time): host {alone.host_ms * 1e3:.1f} us, GPU {alone.gpu_ms * 1e3:.1f} us")
    print("| choices | timer | host us | GPU us | cost us |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['choices']} | {r['timer']} | {r['host_us']:.1f} | {r['gpu_us']:.1f} | {r['cost_us']:.1f} |")
    out = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": datetime.date.today().isoformat(), "probe": name, "rounds": args.rounds,
                    "command": "bench/queue_probe.py " + " ".join(sys.argv[1:])},
           "alone": {"host_us": alone.host_ms * 1e3, "gpu_us": alone.gpu_ms * 1e3}, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
