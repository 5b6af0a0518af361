"""Where a patched layer's host time goes inside a model: the Llama-shaped stack (bench/models.py) with
its `nn.Linear` forwards replaced step by step, timed in interleaved rounds (CUDA events).

Variants, each its own copy of the same model:
- `plain`: nn.Linear as it is;
- `closure`: a per-layer closure calling `F.linear` on the parameter dict (no gemmtune at all);
- `guards`: that plus the checks gemmtune's patched forward makes first (recording, compiling, autocast);
- `keyed`: that plus the per-layer decided-input lookup (a hit);
- `gemmtune_library`: `gemmtune.warmup(backends=("extern",))`, the real patched layers with library picks.

    python bench/patch_overhead.py --m 64 --out patch_overhead.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402  (fresh cache directories, then torch)

torch, gemmtune = models.torch, models.gemmtune
F = torch.nn.functional


def replaced(base: Any, level: int) -> Any:
    """A copy of `base` whose Linear layers run a closure: 0 plain call, 1 with guards, 2 with the key."""
    from gemmtune.dispatch import autocast
    from gemmtune.dispatch.table import TABLE

    model = copy.deepcopy(base)
    compiling, autocast_on = torch.compiler.is_compiling, autocast.enabled
    for m in model.modules():
        if not isinstance(m, torch.nn.Linear):
            continue
        params, decided = m._parameters, set()

        def forward(x: Any, params: Any = params, decided: set = decided) -> Any:
            if level >= 1 and not (TABLE.recorder is None and not (compiling() or autocast_on())):
                return None
            if level >= 2 and (x.shape, x.stride(), x.dtype, x.device) in decided:
                return F.linear(x, params["weight"], params["bias"])
            if level >= 2:
                decided.add((x.shape, x.stride(), x.dtype, x.device))
            return F.linear(x, params["weight"], params["bias"])

        object.__setattr__(m, "forward", forward)
    return model


def layer_us(layer: Any, x: Any, n: int = 2000) -> float:
    """Host µs per call of one layer, back to back (launches only, one synchronize at the end)."""
    for _ in range(50):
        layer(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        layer(x)
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default="patch_overhead.json")
    args = p.parse_args()
    base, inputs = models.build("stack", args.m)
    lib = copy.deepcopy(base)
    gemmtune.warmup(lib, *inputs, backends=("extern",), progress=False, in_model=False, release=False)
    variants: dict[str, Any] = {"plain": copy.deepcopy(base), "closure": replaced(base, 0), "guards": replaced(base, 1),
                                "keyed": replaced(base, 2), "gemmtune_library": lib}
    times: dict[str, list[float]] = {k: [] for k in variants}
    with torch.no_grad():
        for model in variants.values():
            for _ in range(5):
                model(*inputs)
        for r in range(args.rounds):
            for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
                fn: Callable[[], Any] = lambda: variants[name](*inputs)  # noqa: E731
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.iters):
                    fn()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / args.iters)
        x = torch.randn(1, args.m, models.HIDDEN, device="cuda", dtype=torch.bfloat16)
        per_layer = {name: layer_us(model[0].qkv, x) for name, model in variants.items()}
    from gemmtune.dispatch import patching

    plain = times["plain"]
    rows = {name: {"ms": statistics.median(t), "x_plain": statistics.median(a / b for a, b in zip(t, plain)),
                   "layer_host_us": per_layer[name]} for name, t in times.items()}
    facts = {"linear_entries": len(patching._LINEAR), "decided_sizes": sorted(len(d) for d in patching._DECIDED)}
    print(f"| variant | ms per forward | x plain (median of rounds) | qkv layer host µs per call |\n|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['ms']:.3f} | {row['x_plain']:.3f} | {row['layer_host_us']:.2f} |")
    print(facts)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "m": args.m,
            "date": time.strftime("%Y-%m-%d"), "rounds": args.rounds, "iters": args.iters}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "facts": facts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
