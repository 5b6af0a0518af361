"""Steady-state model variants timed in interleaved rounds, with a profile of each: paired ratios.

Host-bound forwards (eager at small M) drift by ±25% between runs on a shared device host, so two
variants timed minutes apart cannot be compared.  This script builds one model per variant (same
weights), prepares every variant first (warm-up, compiles), then times them in `--rounds` rounds; in
each round every variant runs `--iters` forwards back to back (CUDA events), in a shuffled order.  The
ratio of two variants is the median of their per-round ratios, so drift that hits a round hits both.

Per variant it also reports host time per forward (wall clock of the launches, no synchronize inside
the loop) and, from one profiled forward, the GPU kernel time and the number of kernels launched
(`torch.profiler`): a variant that is slower with the same GPU time is paying on the host.

Variants: `eager`, `gemmtune` (warm-up, then the patched model), `inductor`
(max-autotune-no-cudagraphs), `inductor_default` (default-mode compile of the plain model) and
`gemmtune_compile` (default-mode compile of the patched model) and `inductor_gemmtune`
(`gemmtune.inductor.installed()` around a max-autotune-no-cudagraphs compile of the plain model).  Models come from bench/models.py.

    python bench/model_rounds.py --m 1,64 --models stack --out rounds.json
    python bench/model_rounds.py --m 64 --variants eager,gemmtune --rounds 30
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402  (sets fresh cache directories before torch is imported)

torch, gemmtune = models.torch, models.gemmtune
VARIANTS = ("eager", "gemmtune", "inductor", "inductor_default", "gemmtune_compile", "inductor_gemmtune")
# also: "gemmtune_library" (warm-up with backends=("extern",): the patched layers' own host cost) and
# "gemmtune_unchecked" (warm-up without its in-model check: the tuned picks as they are) and
# "gemmtune_release" (checked warm-up with release=True, the default: library-only layers released)


own_frame = models.own_frame


def prepare(variant: str, base: Any, inputs: tuple) -> Callable[[], Any]:
    """A callable running one forward of `variant` on its own copy of `base` (compiled / warmed up)."""
    model = copy.deepcopy(base)
    if variant in ("gemmtune_compile", "inductor", "inductor_default") or variant.startswith("inductor_gemmtune"):
        model = own_frame(gemmtune.patch(model) if variant == "gemmtune_compile" else model, variant)
    if variant in ("gemmtune", "gemmtune_unchecked", "gemmtune_release"):
        # unchecked: the tuned picks, no in-model check; release: layers whose problems all run
        # torch's op are released (the warm-up's default; the others keep every layer patched).
        # Their backends are spelled out so that their
        # dispatch entries are not the checked variant's (one dispatch dict per process).
        spelled = {"gemmtune": None, "gemmtune_unchecked": ("extern", "triton"),
                   "gemmtune_release": ("triton", "extern")}[variant]
        report = gemmtune.warmup(model, *inputs, progress=False, in_model=variant != "gemmtune_unchecked",
                                 backends=spelled, release=variant == "gemmtune_release")
        print(report.table(), file=sys.stderr)
    elif variant == "gemmtune_library":  # picks among library kernels only: the patch's own host cost
        gemmtune.warmup(model, *inputs, backends=("extern",), progress=False, release=False)
    elif variant == "gemmtune_compile":
        model = torch.compile(model)
    elif variant == "inductor":
        model = torch.compile(model, mode="max-autotune-no-cudagraphs")
    elif variant == "inductor_default":
        model = torch.compile(model)
    elif variant != "eager" and not variant.startswith("inductor_gemmtune"):
        raise SystemExit(f"--variants: unknown variant {variant!r}")
    fn = lambda: models.output_of(model, inputs)  # noqa: E731
    if variant.startswith("inductor_gemmtune"):  # Inductor builds gemmtune's picks
        import gemmtune.inductor as gi

        # alone: each pick by itself (nothing benchmarked); default: a library pick with its two fusion companions;
        # 1: with its best Triton config only
        model = torch.compile(model, mode="max-autotune-no-cudagraphs")
        companions = {"inductor_gemmtune": 2, "inductor_gemmtune_alone": 0, "inductor_gemmtune1": 1}[variant]
        with gi.installed(fusion=companions) as handler, gi.benchmark_probe() as counted:
            fn()
        print(f"  {variant}: Inductor benchmarked {counted.choices} choices; {dict(handler.stats)}", file=sys.stderr)
        if not handler.stats["hit"] + handler.stats["miss"]:
            raise SystemExit("inductor_gemmtune: Inductor never asked gemmtune (a reused compiled program?)")
        for pick in {id(p): p for p in handler.picks.values()}.values():  # what Inductor was told to build
            print(f"  {variant}: {pick.problem}: {pick.source} (exact={pick.exact}, "
                  f"{len(pick.entries)} entries, {len(pick.companions)} companions)", file=sys.stderr)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return fn


def time_round(fn: Callable[[], Any], iters: int) -> tuple[float, float]:
    """(ms per forward by CUDA events, host ms per forward for the launches) over `iters` forwards."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    host = (time.perf_counter() - t0) * 1e3 / iters
    end.synchronize()
    return start.elapsed_time(end) / iters, host


def profile(fn: Callable[[], Any]) -> dict[str, float]:
    """GPU kernel ms and kernel count of one forward, from torch.profiler."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"gpu_kernel_ms": sum(e.device_time for e in kernels) / 1e3, "kernels": len(kernels)}


ATTENTION = ("flash", "fmha", "attention", "sdpa", "efficient")
GEMM_WORDS = ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "splitk")
GEMM_TOKENS = {"mm", "bmm", "addmm", "tem", "scaled"}


def kernel_kind(name: str) -> str:
    """The category of one CUDA kernel by its name: gemm, attention, triton (Inductor's pointwise and
    reduction kernels) or other.  A kernel Inductor generated from a GEMM (a template, or a matrix-vector
    reduction lowered from an `mm`) has the token `mm` (or `tem`) in its name.

        >>> [kernel_kind(n) for n in ("nvjet_tst_128x64", "triton_tem_fused_mm_0", "triton_red_fused_mm_mul_sum_1",
        ...                          "triton_poi_fused_add_2", "flash_fwd_kernel", "elementwise_kernel")]
        ['gemm', 'gemm', 'gemm', 'triton', 'attention', 'other']
    """
    low = name.lower()
    if any(w in low for w in ATTENTION):
        return "attention"
    if any(w in low for w in GEMM_WORDS) or GEMM_TOKENS & set(low.replace("-", "_").split("_")):
        return "gemm"
    return "triton" if low.startswith("triton_") else "other"


def kernel_split(fn: Callable[[], Any], iters: int = 5, top: int = 14) -> dict[str, Any]:
    """GPU ms per call by kernel kind (`kernel_kind`), kernels per call, and the `top` kernels by time,
    over `iters` profiled calls of `fn` (torch.profiler)."""
    from collections import Counter

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    kinds: Counter = Counter()
    names: Counter = Counter()
    count = 0
    for e in p.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        count += 1
        kinds[kernel_kind(e.name)] += e.device_time / 1e3 / iters
        names[e.name[:80]] += e.device_time / 1e3 / iters
    return {"ms": {k: round(v, 4) for k, v in kinds.items()}, "total_ms": round(sum(kinds.values()), 4),
            "kernels": count / iters, "top": [[n, round(v, 4)] for n, v in names.most_common(top)]}


def run(name: str, m: int, variants: list[str], rounds: int, iters: int) -> list[dict[str, Any]]:
    # One set of cache directories for the whole process (set when `models` was imported): these rounds
    # time steady states, and a Triton directory changed between Ms would make the isolation worker
    # compile again what this process already holds in memory (docs/MODELS.md run G).
    torch._dynamo.reset()
    gemmtune.clear_dispatch_cache()
    base, inputs = models.build(name, m)
    with torch.no_grad():
        ref = models.output_of(base, inputs)
        fns = {v: prepare(v, base, inputs) for v in variants}
        del base
        times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        order = list(variants)
        for _ in range(rounds):
            random.shuffle(order)
            for v in order:
                times[v].append(time_round(fns[v], iters))
        rows = []
        for v in variants:
            ms = [t[0] for t in times[v]]
            first = [t[0] for t in times[variants[0]]]
            ratio = [a / b for a, b in zip(ms, first)]
            rows.append({"model": name, "M": m, "variant": v, "ms": statistics.median(ms),
                         "ms_q1_q3": statistics.quantiles(ms, n=4)[::2],
                         "host_ms": statistics.median(t[1] for t in times[v]),
                         f"ratio_vs_{variants[0]}": statistics.median(ratio),
                         "ratio_q1_q3": statistics.quantiles(ratio, n=4)[::2],
                         "rel_err": models.rel_err(fns[v](), ref), **profile(fns[v])})
    del fns
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", default="1,64,128")
    p.add_argument("--models", default="stack")
    p.add_argument("--variants", default=",".join(VARIANTS), help="the first is the ratios' reference")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default="model_rounds.json")
    args = p.parse_args(argv)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv), "rounds": args.rounds, "iters": args.iters}
    rows: list[dict[str, Any]] = []
    variants = args.variants.split(",")
    for m in (int(v) for v in args.m.split(",")):
        for name in args.models.split(","):
            rows += run(name, m, variants, args.rounds, args.iters)
            Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    ref = variants[0]
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']}; {args.rounds} rounds x {args.iters} forwards")
    print(f"| model | M | variant | ms | x {ref} (median of rounds) | q1-q3 | host ms | GPU kernel ms | kernels | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = r["ratio_q1_q3"]
        print(f"| {r['model']} | {r['M']} | {r['variant']} | {r['ms']:.3f} | {r[f'ratio_vs_{ref}']:.3f} | "
              f"{q[0]:.3f}-{q[1]:.3f} | {r['host_ms']:.3f} | {r['gpu_kernel_ms']:.3f} | {r['kernels']} | "
              f"{r['rel_err']:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
