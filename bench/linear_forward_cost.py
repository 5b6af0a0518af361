"""What a patched `nn.Linear` costs inside a model, not in a loop of one layer: forward variants on the CPU.

In a loop of one layer the patched warm path is cheaper than `nn.Linear.forward`
(`bench/layer_host_cost.py`), yet a launch-bound model forward ran about 1 % slower after `warmup`
(docs/MODELS.md).  This script reads the per-forward cost of layer variants inside a model: the
stack of `bench/models.py` at a small width on the CPU, one thread, every `nn.Linear` changed alike.
Each variant runs on `--copies` copies of the model (one copy's memory layout alone moved a reading
by about 1 %), all copies timed in shuffled rounds; a variant's round time is the mean over its
copies, read against plain eager's in the same round (median, and a bootstrap 95 % interval).

Variants: `eager` (plain `nn.Linear`); `patched` (`gemmtune.patch`, every input size decided for
`F.linear`: the warm path of a warm-up with `release=False`); `released` (patched, then unpatched);
`lean` (what a warm-up releases a layer to, by default: `dispatch.release.lean_forward`); `warmed`
(`gemmtune.warmup` itself, library kernels only, so every layer is released);
`closure` (an instance forward calling `F.linear` on the parameter dict); `subclass` (that forward
on a subclass); `check` (the closure behind `torch.compiler.is_compiling()`); `decided` (the closure
behind a decided-size set check).

    python bench/linear_forward_cost.py --out linear_forward_cost.json

CPU only (no GPU needed); prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import gemmtune  # noqa: E402
from gemmtune.dispatch.patching import release  # noqa: E402
from gemmtune.dispatch.release import lean_forward  # noqa: E402
from linear_variants import set_forwards  # noqa: E402

VARIANTS = ("eager", "patched", "released", "lean", "warmed", "closure", "subclass", "check", "decided")


def apply(variant: str, model: nn.Module) -> nn.Module:
    """`model` (in place) with every `nn.Linear` changed as `variant` says; returns it."""
    if variant in ("patched", "released"):
        gemmtune.patch(model, backends=("extern",))
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.__dict__["_gemmtune_decided"].add(m.in_features)  # a [1, 1, K] input: numel K
        if variant == "released":
            gemmtune.unpatch(model)
    elif variant == "warmed":
        x = torch.randn(1, 1, next(m for m in model.modules() if isinstance(m, nn.Linear)).in_features)
        gemmtune.warmup(model, x, backends=("extern",), progress=False, in_model=False)
    elif variant == "lean":
        for m in gemmtune.patch(model, backends=("extern",)).modules():
            if isinstance(m, nn.Linear):
                release(m, lean_forward)
    elif variant != "eager":
        set_forwards(model, variant)
    return model


def build(width: int, layers: int) -> tuple[nn.Module, torch.Tensor]:
    import models  # the stack's layer; importing it points the caches at scratch folders (a benchmark)

    torch.manual_seed(0)
    return nn.Sequential(*[models.Layer(width) for _ in range(layers)]).eval(), torch.randn(1, 1, width)


def rounds_of(fns: dict[str, list[Callable[[], Any]]], rounds: int, iters: int) -> dict[str, list[float]]:
    """Per variant, its mean µs per forward over its copies, one value per shuffled round."""
    every = [(v, f) for v, fs in fns.items() for f in fs]
    order = list(range(len(every)))
    times: dict[str, list[float]] = {v: [] for v in fns}
    for _ in range(rounds):
        random.shuffle(order)
        acc = dict.fromkeys(fns, 0.0)
        for i in order:
            v, f = every[i]
            t0 = time.perf_counter()
            for _ in range(iters):
                f()
            acc[v] += (time.perf_counter() - t0) / iters * 1e6 / len(fns[v])
        for v in fns:
            times[v].append(acc[v])
    return times


def paired(ms: list[float], ref: list[float]) -> dict[str, float]:
    """Median of the per-round ratios ms / ref and a bootstrap 95 % interval of that median."""
    ratios = [a / b for a, b in zip(ms, ref)]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(400))
    return {"x_eager": statistics.median(ratios), "lo": boot[10], "hi": boot[389]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--rounds", type=int, default=201)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", default="linear_forward_cost.json")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "eager" not in variants:
        raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)} (eager is the reference)")
    torch.set_num_threads(1)
    base, x = build(args.width, args.layers)
    fns: dict[str, list[Callable[[], Any]]] = {v: [] for v in variants}
    with torch.no_grad():
        ref = base(x)
        for _ in range(args.copies):  # copies interleaved in memory: no variant gets one region
            for v in variants:
                model = apply(v, copy.deepcopy(base))
                assert torch.equal(model(x), ref), v
                fns[v].append(lambda model=model: model(x))
        times = rounds_of(fns, args.rounds, args.iters)
    rows = {v: {"us": statistics.median(times[v]), **paired(times[v], times["eager"])} for v in variants}
    meta = {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor(),
            "date": time.strftime("%Y-%m-%d"),
            "command": "bench/linear_forward_cost.py " + " ".join(argv or sys.argv[1:]),
            "width": args.width, "layers": args.layers, "copies": args.copies, "rounds": args.rounds}
    print(table(rows, meta))
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


def table(rows: dict[str, dict[str, float]], meta: dict[str, Any]) -> str:
    """The run as Markdown: one line per variant, read against plain eager."""
    head = (f"Python {meta['python']}, torch {meta['torch']}; {meta['layers'] * 4} linear layers, width "
            f"{meta['width']}, {meta['copies']} copies per variant, {meta['rounds']} rounds")
    lines = [f"| {v} | {r['us']:.1f} | {r['x_eager']:.4f} ({r['lo']:.4f}-{r['hi']:.4f}) |" for v, r in rows.items()]
    return "\n".join([head, "| variant | µs per forward | x plain eager (95 % interval) |", "|---|---|---|", *lines])


if __name__ == "__main__":
    raise SystemExit(main())
