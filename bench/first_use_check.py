"""The first-use check's cost per pick: a tune served from a shared store with and without the check,
and the check alone.

A pick read from a shared store (docs/SCALE.md, "A store you share is a store you check") runs once
on the tune's operands and is compared with the float64 reference before it serves anything.  For
each size, one tune fills a SQLite store; then, `--reps` times in turn: a hit from a store object
opened fresh (a new process's first use), trusted (the private file, `store_shared="auto"`) and
shared (`store_shared="on"`: the check runs), and the check alone (`store.checked.wrong_output`: the
reference, one run of the pick, the comparison).  Medians; prints a table and writes JSON.

    PYTHONPATH=src python bench/first_use_check.py --device cpu --out bench/results/first_use_check_cpu.json
    PYTHONPATH=src python bench/first_use_check.py --device cuda --backends triton --sizes 256,1024,4096 \\
        --out bench/results/first_use_check_gpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import gemmtune
from gemmtune.core.settings import Settings
from gemmtune.store.checked import wrong_output
from gemmtune.store.locations import forget_stores


def _timed(fn, device: str) -> tuple[float, object]:
    """(ms, result) of `fn()`, the device synchronised on both sides."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return (time.perf_counter() - t0) * 1e3, out


def measure(device: str, size: int, dtype: torch.dtype, backends: tuple[str, ...], reps: int, where: Path) -> dict:
    """One size: the hit trusted and checked, and the check alone (ms, medians over `reps`)."""
    torch.manual_seed(size)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    base = dict(store=str(where / f"store-{size}.sqlite"), backends=backends)
    first = gemmtune.tune("mm", a, b, settings=Settings(**base))  # fills the store
    kinds = {"trusted": Settings(**base), "shared": Settings(**base, store_shared="on")}
    ms: dict[str, list[float]] = {"trusted": [], "shared": [], "check": []}
    for _ in range(reps):
        for kind, settings in kinds.items():
            forget_stores()  # a fresh store object: what a new process opens, nothing checked yet
            gemmtune.clear_dispatch_cache()
            t, hit = _timed(lambda: gemmtune.tune("mm", a, b, settings=settings), device)
            assert hit.cache_hit and hit.winner == first.winner, (kind, hit.winner, first.winner)
            ms[kind].append(t)
        t, why = _timed(lambda: wrong_output(first.problem, lambda: hit(a, b), (a, b)), device)
        assert why is None, why
        ms["check"].append(t)
    med = {k: statistics.median(v) for k, v in ms.items()}
    return dict(size=size, dtype=str(dtype).replace("torch.", ""), pick=first.winner.key, reps=reps,
                hit_trusted_ms=round(med["trusted"], 4), hit_checked_ms=round(med["shared"], 4),
                check_per_pick_ms=round(med["shared"] - med["trusted"], 4), check_alone_ms=round(med["check"], 4))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--sizes", default="64,256,512,1024", help="square problem sizes, comma-separated")
    p.add_argument("--dtype", default=None, help="float32 (cpu default) or bfloat16 (cuda default), float16")
    p.add_argument("--backends", default="extern", help="backend families, comma-separated (a Triton pick: triton)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=None, help="write the JSON here")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    backends = tuple(x for x in args.backends.split(",") if x)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gemmtune-first-use-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            rows.append(measure(args.device, size, dtype, backends, args.reps, Path(tmp)))
            r = rows[-1]
            print(f"{r['size']:>6} {r['dtype']:>9} {r['pick'][:40]:<40} hit {r['hit_trusted_ms']:9.3f} ms"
                  f"  checked {r['hit_checked_ms']:9.3f} ms  check/pick {r['check_per_pick_ms']:8.3f} ms"
                  f"  check alone {r['check_alone_ms']:8.3f} ms", flush=True)
    device = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else \
        (platform.processor() or platform.machine())
    result = dict(script="bench/first_use_check.py", argv=sys.argv[1:], device=device, torch=torch.__version__,
                  gemmtune=gemmtune.__version__, date=time.strftime("%Y-%m-%d"), backends=list(backends), rows=rows)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
