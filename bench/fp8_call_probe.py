"""The same cuBLASLt kernel through each way gemmtune and torch call it, by two timers.

For fp8 shapes of bench/shapes_fp8.json, times interleaved (gemmtune's CudaTimer, L2 flushed) and by
`triton.testing.do_bench`:
- `torch._scaled_mm(a, b, sa, sb, out_dtype=bf16)`, as a user calls it;
- the same with `out=` a preallocated tensor;
- the Selection of a tune limited to the library kernel (`aten_scaled_mm`), called as compare.py calls it;
- `gemmtune.scaled_mm` (eager dispatch, the store off).
Where the four read differently for one kernel, the difference is the call path, not the kernel.
Prints a table and writes JSON.

    python bench/fp8_call_probe.py --only llama3-8b-down-m8192-tensorwise --out probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))


def probe(spec, rounds: int) -> dict:
    import torch
    from triton.testing import do_bench

    import gemmtune
    from gemmtune.core.settings import Settings
    from gemmtune.measure.timers import CudaTimer
    from gemmtune.templates.extern import AtenScaledMMTemplate

    a, b, sa, sb = spec.tensors("cuda")
    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device="cuda")
    settings = Settings.from_env().with_(store="off")
    sel = gemmtune.tune("scaled_mm", a, b, sa, sb, templates=[AtenScaledMMTemplate()], settings=settings)
    fns = {"torch._scaled_mm": lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16),
           "torch._scaled_mm out=": lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, out=out),
           "Selection (library only)": lambda: sel(a, b, sa, sb),
           "gemmtune.scaled_mm": lambda: gemmtune.scaled_mm(a, b, sa, sb)}
    timer = CudaTimer(torch.device("cuda"), rep_ms=50, count_host=False, flush=settings.l2_flush)
    measured = timer.time_interleaved(list(fns.values()), rounds)
    return {"name": spec.name, "problem": spec.describe(),
            "timer_ms": {k: m.cost_ms for k, m in zip(fns, measured)},
            "do_bench_ms": {k: do_bench(fn, warmup=25, rep=100) for k, fn in fns.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", default=str(ROOT / "bench" / "shapes_fp8.json"))
    p.add_argument("--only", required=True, help="comma-separated shape names of the suite")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import torch

    from gemmtune.offline.suite import load_suite

    wanted = args.only.split(",")
    specs = [s for s in load_suite(args.suite) if s.name in wanted]
    if len(specs) != len(wanted):
        raise SystemExit(f"--only: unknown shape(s) {', '.join(sorted(set(wanted) - {s.name for s in specs}))}")
    if not torch.cuda.is_available():
        raise SystemExit("fp8_call_probe.py measures on a CUDA GPU")
    rows = []
    for spec in specs:
        rows.append(probe(spec, args.rounds))
        if args.out:
            Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print("| shape | call | timer ms | do_bench ms |\n|---|---|---|---|")
    for r in rows:
        for k in r["timer_ms"]:
            print(f"| {r['name']} | {k} | {r['timer_ms'][k]:.4f} | {r['do_bench_ms'][k]:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
