"""Serving: a causal LM at every batch size from one compile or one warm-up, in the models protocol.

M is batch x tokens: decode at M in {1, 2, 4, ..., 256} (M sequences of one token), prefill at M in {512, ...,
4096} (one sequence of M tokens), always visited in a shuffled order.  Variants: `eager`; `default` and
`max_autotune` (`torch.compile(dynamic=True)`, default mode and max-autotune-no-cudagraphs); `gemmtune`
(`gemmtune.inductor.install(m=LO:HI)`, then the default dynamic compile); `eager_range` (`gemmtune.warmup(model,
x, m=LO:HI)`, then eager); `static` (max-autotune-no-cudagraphs compiled for each M of `--static`, timed in a
process of its own beside `gemmtune`).  First calls: each `--first` variant in a fresh process
on new caches (`*_store`: gemmtune's store as its variant left it, new Triton and Inductor caches; `*_again`:
every cache as left): its set-up, then a first call at each M (seconds to the end of each), what Inductor
benchmarked, what gemmtune tuned, and gemmtune's tunes after the set-up.  Steady state: one process sets each
`--steady` variant up from those caches; per round the M values shuffled and, at each M, the variants shuffled,
`--iters` calls each: the median ms and the median per-round ratio to `max_autotune`; then the GEMM kernels' GPU
time per call (torch.profiler) and the relative error against eager.  Writes JSON after every process.

    python bench/serving.py --out serving.json                       # a GPU: the transformers Llama (2 layers)
    python bench/serving.py --model tiny --m 1,4,16 --first eager_range --steady eager,eager_range --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import model_runs  # noqa: E402
from model_runs import MAX_AUTOTUNE, _sync, own_frame, rel_err, time_round, torch  # noqa: E402
from models import spawn  # noqa: E402

DECODE, PREFILL = [2 ** i for i in range(9)], [512 * 2 ** i for i in range(4)]
VARIANTS = ("eager", "default", "max_autotune", "gemmtune", "eager_range", "static")
FIRST = ("default", "max_autotune", "gemmtune", "gemmtune_store", "eager_range", "eager_range_store",
         "eager_range_again")
PHASES = {"_store": "store", "_again": "keep"}  # the caches a suffix keeps (model_runs.cache_env)
GEMM = re.compile(r"gemm|gemv|nvjet|xmma|cutlass|cublas|triton_tem|mm_kernel|splitk|skinny|tma_persist|matmul", re.I)


def build(name: str) -> tuple[Any, Callable[[int], tuple]]:
    """The model `name` (`lm`: a 2-layer transformers LlamaForCausalLM of Llama-3-8B dimensions, bf16; `tiny`:
    model_runs' tiny stack) and `inputs(m)`: decode (m sequences of a token) up to 256, else prefill."""
    if name == "tiny":
        model, _ = model_runs.build("tiny", 1)
        width = model[0].hidden
        return model, lambda m: ((torch.randn(m, 1, width) if m <= 256 else torch.randn(1, m, width)).to(
            next(model.parameters())),)
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=model_runs.HIDDEN, intermediate_size=model_runs.FFN, num_attention_heads=32,
                      num_key_value_heads=8, num_hidden_layers=2, vocab_size=32000, max_position_embeddings=8192,
                      attn_implementation="sdpa", use_cache=False)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model, lambda m: (torch.randint(0, 32000, (m, 1) if m <= 256 else (1, m), device="cuda"),)


def output_of(model: Any, inputs: tuple) -> torch.Tensor:
    return getattr(out := model(*inputs), "logits", out)  # a causal LM's logits, or the tensor


def set_up(variant: str, model: Any, inputs: Callable[[int], tuple], ms: list[int]) -> tuple[Callable, dict]:
    """`run(inputs)` of one variant of `model` (compiled lazily, or warmed up over the range now) and its facts."""
    import gemmtune
    span, facts = f"{min(ms)}:{max(ms)}", {}
    if variant == "eager_range":
        report = gemmtune.warmup(model, *inputs(64), progress=False, m=span, inputs_at=inputs)
        facts.update(warmup_s=round(report.seconds, 3), tuned=report.tuned, problems=len(report.rows),
                     released=len(report.released), warmup_phases_s=report.phases())
    if variant in ("eager", "eager_range"):
        return (lambda x: output_of(model, x)), facts
    if variant == "static":
        kept: dict[tuple, Callable] = {}

        def per_size(x: tuple) -> Any:
            shape = tuple(x[0].shape)
            if shape not in kept:
                kept[shape] = torch.compile(own_frame(model, f"static {shape}"), mode=MAX_AUTOTUNE, dynamic=False)
            return output_of(kept[shape], x)
        return per_size, facts
    if variant == "gemmtune":
        import gemmtune.inductor as gi
        facts["handler"] = gi.install(m=span)
    compiled = torch.compile(own_frame(model, variant), dynamic=True,
                             mode=MAX_AUTOTUNE if variant == "max_autotune" else None)
    return (lambda x: output_of(compiled, x)), facts


def first_child(name: str, ms: list[int], variant: str, seed: int) -> dict[str, Any]:
    """One fresh process: `variant`'s set-up, then a first call at each M in a shuffled order."""
    import gemmtune
    import gemmtune.inductor as gi
    from gemmtune.inductor import dynamic
    tunes = lambda: int(gemmtune.dispatch_stats()["tunes"])  # noqa: E731
    base = variant[:-6] if variant[-6:] in PHASES else variant
    model, inputs = build(name)
    order = random.Random(seed).sample(ms, len(ms))
    with torch.no_grad(), gi.benchmark_probe() as probe:
        t0 = time.perf_counter()
        run, facts = set_up(base, model, inputs, ms)
        setup_s, tuned, per_m = time.perf_counter() - t0, tunes(), {}
        for m in order:
            t = time.perf_counter()
            run(inputs(m))
            _sync()
            per_m[m] = round(time.perf_counter() - t, 3)
        total = time.perf_counter() - t0
    handler = facts.pop("handler", None)
    return {"variant": variant, "setup_s": round(setup_s, 3), "total_s": round(total, 3), "first_s": per_m,
            "order": order, "benchmarked": probe.choices, "tunes_after_setup": tunes() - tuned,
            "buckets": dict(dynamic.STATS), **({"handler": dict(handler.stats)} if handler else {}), **facts}


def gemm_ms(run: Callable[[], Any], iters: int = 5) -> tuple[float, float]:
    """(GEMM kernels', all kernels') GPU ms per call of `run`, from torch.profiler's kernel times."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
        _sync()
    kernels = [(e.key, e.self_device_time_total) for e in prof.key_averages() if e.self_device_time_total > 0]
    return (sum(t for k, t in kernels if GEMM.search(k)) / iters / 1e3, sum(t for _, t in kernels) / iters / 1e3)


def steady_child(name: str, ms: list[int], variants: list[str], root: Path, rounds: int, iters: int,
                 seed: int) -> list[dict[str, Any]]:
    """Every variant set up from its caches, warmed at each M, then timed in shuffled rounds (module docstring)."""
    import gemmtune.inductor as gi
    from gemmtune.store.locations import forget_stores
    torch._dynamo.config.recompile_limit = 64  # each variant compiles the model's own frames for 3 kinds of input
    base, inputs = build(name)
    xs, runs = {m: inputs(m) for m in ms}, {}
    with torch.no_grad():
        for v in variants:
            os.environ.update(model_runs.cache_env(root, v, "keep"))
            forget_stores()
            runs[v], _ = set_up(v, copy.deepcopy(base), inputs, ms)
            for m in ms:
                runs[v](xs[m])
            while gi.available() and gi.installer._PRIOR:
                gi.uninstall()
        _sync()
        ref = {m: output_of(base, xs[m]) for m in ms}
        errs = {(m, v): rel_err(runs[v](xs[m]), ref[m]) for m in ms for v in variants}
        rng, times = random.Random(seed), {(m, v): [] for m in ms for v in variants}
        for _ in range(rounds):
            for m in rng.sample(ms, len(ms)):
                for v in rng.sample(variants, len(variants)):
                    times[m, v].append(time_round(lambda: runs[v](xs[m]), iters))
        split = {(m, v): gemm_ms(lambda: runs[v](xs[m])) if torch.cuda.is_available() else (None, None)
                 for m in ms for v in variants}
    rows = []
    for (m, v), t in times.items():
        ratio, quartiles = model_runs._paired(t, times.get((m, "max_autotune")))
        rows.append({"M": m, "variant": v, "ms": statistics.median(t), "ratio_vs_max_autotune": ratio,
                     "ratio_q1_q3": quartiles, "ratio_vs_eager": model_runs._paired(t, times.get((m, "eager")))[0],
                     "gemm_ms": split[m, v][0], "gpu_ms": split[m, v][1], "rel_err": errs[m, v],
                     "round_ms": [round(x, 4) for x in t]})
    return rows


def print_tables(out: dict) -> None:
    """The first calls and, per M, each variant's ms, ratio to max_autotune and GEMM time, as Markdown."""
    print(f"\n{out['meta']['device']}, torch {out['meta']['torch']}, {out['meta']['date']}")
    print("| variant | set-up s | all M s | Inductor benchmarks | tunes after set-up |\n|---|---|---|---|---|")
    for r in out["first"]:
        cells = [r.get("error") or f"{r['setup_s']:.1f}", f"{r.get('total_s', 0):.1f}", r.get("benchmarked", "-"),
                 r.get("tunes_after_setup", "-")]
        print(f"| {r['variant']} | " + " | ".join(map(str, cells)) + " |")
    print("\n| M | variant | ms | x max_autotune (q1-q3) | x eager | GEMM ms | rel. err |\n" + "|---" * 7 + "|")
    for r in sorted(out["steady"], key=lambda r: (r.get("M", 0), r.get("variant", ""))):
        if "error" in r:
            print(f"| - | - | {r['error']} | | | | |")
            continue
        q, g = r["ratio_q1_q3"], "-" if r["gemm_ms"] is None else f"{r['gemm_ms']:.4f}"
        print(f"| {r['M']} | {r['variant']} | {r['ms']:.4f} | {r['ratio_vs_max_autotune']:.3f} ({q[0]:.3f}-{q[1]:.3f})"
              f" | {r['ratio_vs_eager']:.3f} | {g} | {r['rel_err']:.1e} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="lm", choices=("lm", "tiny"))
    p.add_argument("--m", default=",".join(map(str, DECODE + PREFILL)), help="the M values, comma-separated")
    p.add_argument("--first", default=",".join(FIRST), help="first-call variants, each in a fresh process")
    p.add_argument("--steady", default=",".join(VARIANTS[:-1]), help="steady-state variants, in one process")
    p.add_argument("--static", default="", help="the M values at which `static` runs (a compile each)")
    for flag, default in (("--rounds", 10), ("--iters", 5), ("--seed", 0)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--child", nargs=2, metavar=("KIND", "ARG"), help=argparse.SUPPRESS)
    p.add_argument("--root", default="", help="the caches' folder (default: new)")
    p.add_argument("--out", default="serving.json")
    a = p.parse_args(argv)
    a.m, a.first, a.steady = ([x for x in text.split(",") if x] for text in (a.m, a.first, a.steady))
    bad = [v for v in a.first if v not in FIRST] + [v for v in a.steady if v not in VARIANTS]
    if bad or not a.m or not all(x.isdigit() and 0 < int(x) <= 65536 for x in a.m):
        p.error(f"bad --m or variant(s) {', '.join(bad)}: first {', '.join(FIRST)}; steady {', '.join(VARIANTS)}")
    a.m = sorted({int(x) for x in a.m})
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.child:  # a child process: its JSON on the last line
        kind, arg = a.child
        rec = first_child(a.model, a.m, arg, a.seed) if kind == "first" else steady_child(
            a.model, [int(x) for x in a.static.split(",")] if arg == "static" else a.m, a.steady if arg == "all"
            else ["gemmtune", "static"], Path(a.root), a.rounds, a.iters, a.seed)
        print(json.dumps(rec, default=str))
        return 0
    root = Path(a.root or tempfile.mkdtemp(prefix="gemmtune-serving-"))
    command = " ".join(["bench/serving.py", *(sys.argv[1:] if argv is None else argv)])
    out: dict[str, Any] = {"meta": {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
                                    "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                                    "command": command, "M": a.m, "env": {"GEMMTUNE_SHARE_KERNELS": os.environ.get(
                                        "GEMMTUNE_SHARE_KERNELS", "")}}, "first": [], "steady": []}
    common = ["--model", a.model, "--m", ",".join(map(str, a.m)), "--root", str(root), "--seed", str(a.seed),
              "--rounds", str(a.rounds), "--iters", str(a.iters), "--steady", ",".join(a.steady), "--static", a.static]
    for variant in a.first:
        phase = PHASES.get(variant[-6:], "new")
        group = variant if phase == "new" else variant[:-6]
        rec = spawn(["--child", "first", variant, *common], model_runs.cache_env(root, group, phase), 590,
                    script="serving.py")
        out["first"].append({"variant": variant, **rec})
        Path(a.out).write_text(json.dumps(out, indent=1, default=str))
    for what in (["all"] if a.steady else []) + (["static"] if a.static else []):
        rows = spawn(["--child", "steady", what, *common], {}, 590, script="serving.py")
        out["steady"] += rows if isinstance(rows, list) else [rows]
        Path(a.out).write_text(json.dumps(out, indent=1, default=str))
    print_tables(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
