"""Whole models with gemmtune, side by side with plain PyTorch and Inductor max-autotune, in one run.

Models (bf16, CUDA, eval, batch 1 with M tokens):
- `stack`: 4 Llama-3-8B-shaped decoder layers: RMSNorm, qkv 4096->6144, causal
  `scaled_dot_product_attention` (32 query heads, 8 KV heads), o 4096->4096, RMSNorm, gate_up
  4096->28672, SiLU-and-multiply, down 14336->4096; `nn.Linear` without bias.
- `llama`: a `transformers` LlamaModel built from a config (Llama-3-8B dimensions, 2 layers, random
  weights, nothing downloaded).

Variants, each timed in this process (median of 5 loops of `--iters` forwards, CUDA events; the
median of `triton.testing.do_bench` as a second opinion):
- `eager`: the model as it is;            `eager_graph`: its forward captured in a CUDA graph;
- `gemmtune`: `gemmtune.warmup` then the patched model; `gemmtune_graph`: that under a CUDA graph;
- `inductor`: `torch.compile(mode="max-autotune-no-cudagraphs")` of the plain model;
- `gemmtune_compile`: `torch.compile` (default mode) of the patched model: each GEMM is decided at
  trace time and emitted as the pick itself;
- `inductor_gemmtune` (not in the default list): `gemmtune.inductor.install()`, then
  `torch.compile(mode="max-autotune-no-cudagraphs")` of the plain model: Inductor builds gemmtune's
  pick for each GEMM (tuned on a miss) and benchmarks nothing.  Recorded twice: cold (empty store,
  `first_s`) and warm (a second program start: new Inductor and Triton caches, the store kept:
  `warm_first_s`), each with the GEMMs tuned, answered by the store, and the choices Inductor
  benchmarked (`*_benchmarked`; the `inductor` variant records its own count for comparison).
First-run time is the first forward including tuning and compiling, with fresh caches: the process
points TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and the gemmtune store at new directories (one each
per variant).  `gemmtune` also records a second start (dispatch dict cleared, store on disk): what a
second run of the same program pays.

    python bench/models.py --m 64 --out models_m64.json
    python bench/models.py --m 1,16 --models stack --variants eager,gemmtune --out m.json
    python bench/models.py --m 16,512 --models stack --variants inductor,inductor_gemmtune --out ind.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
SCRATCH = Path(tempfile.mkdtemp(prefix="gemmtune-models-"))


def fresh_caches(tag: str) -> None:
    """New Triton, Inductor and gemmtune cache locations for the next variant (cold start).

    gemmtune's kept isolation worker is stopped too: it reads the Triton cache directory it started
    with, and a later variant compiling into a new one would leave it compiling every binary again.
    Still, binaries this process compiled before stay in Triton's in-memory cache and are not written
    to the new directory: first-run times of a variant after another tuned in the same process are
    pessimistic.  `bench/warmup_profile.py` times each first run in a fresh process."""
    isolation = sys.modules.get("gemmtune.bench.isolation")  # not imported yet: no worker either
    if isolation is not None:
        isolation.shutdown_workers()
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "GEMMTUNE_CACHE_DIR"):
        d = SCRATCH / tag / var.lower()
        d.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(d)
    os.environ["GEMMTUNE_STORE"] = str(SCRATCH / tag / "store.db")


fresh_caches("start")
import torch  # noqa: E402
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmtune  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FFN = 4096, 32, 8, 14336


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        hd = HIDDEN // HEADS
        self.norm1, self.norm2 = RMSNorm(HIDDEN), RMSNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * hd, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.gate_up = nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, m, _ = x.shape
        hd = HIDDEN // HEADS
        q, k, v = self.qkv(self.norm1(x)).split([HIDDEN, KV_HEADS * hd, KV_HEADS * hd], dim=-1)
        q = q.view(b, m, HEADS, hd).transpose(1, 2)
        k = k.view(b, m, KV_HEADS, hd).transpose(1, 2)
        v = v.view(b, m, KV_HEADS, hd).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=m > 1, enable_gqa=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, m, HIDDEN))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def build(name: str, m: int) -> tuple[nn.Module, tuple]:
    """The model, built on the GPU in bf16 (random weights), and its example inputs for `m` tokens."""
    torch.manual_seed(0)
    if name == "stack":
        with torch.device("cuda"):
            model = nn.Sequential(*[Layer() for _ in range(4)]).to(torch.bfloat16)
            x = (torch.randn(1, m, HIDDEN) * 0.5).to(torch.bfloat16)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.02)
        return model.eval(), (x,)
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, num_hidden_layers=2, vocab_size=32000,
                      max_position_embeddings=8192, attn_implementation="sdpa", use_cache=False)
    with torch.device("cuda"):
        model = LlamaModel(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, m), device="cuda")
    return model, (ids,)


def output_of(model: nn.Module, inputs: tuple) -> torch.Tensor:
    out = model(*inputs)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out


def steady(fn: Callable[[], Any], iters: int) -> dict[str, float]:
    """Median ms per forward over 5 loops of `iters` (CUDA events), and do_bench's median."""
    import triton.testing

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    loops = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        loops.append(start.elapsed_time(end) / iters)
    return {"ms": statistics.median(loops), "do_bench_ms": triton.testing.do_bench(fn, return_mode="median")}


def graphed(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """`fn` captured once in a CUDA graph; the returned callable replays it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


def first_call(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def selection_facts() -> list[dict[str, Any]]:
    """Per problem this process tuned: where its tuning time went (compile, prescreen, final)."""
    from gemmtune.dispatch import eager

    return [{"problem": sel.problem.describe(), "winner": sel.winner.name, "tuning_s": sel.tuning_s,
             "compile_s": sel.compile_s, "binaries": len(sel.binary_seconds or {}),
             "binary_sum_s": sum((sel.binary_seconds or {}).values()), "prescreen_s": sel.prescreen_s,
             "final_s": sel.benchmark_s, "runs": sel.benchmark_runs, "strategy": sel.strategy,
             "from_store": bool(sel.cache_hit)} for sel in eager.selections().values()]


class Stamped:
    """gemmtune's INFO log lines, each stamped with seconds since the block began (`.lines`)."""

    def __enter__(self) -> "Stamped":
        import logging

        self.lines: list[tuple[float, str]] = []
        self.t0 = time.perf_counter()
        outer = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                outer.lines.append((round(time.perf_counter() - outer.t0, 3), record.getMessage()[:200]))

        self.handler, self.log = Handler(), logging.getLogger("gemmtune")
        self.level = self.log.level
        self.log.addHandler(self.handler)
        self.log.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.log.removeHandler(self.handler)
        self.log.setLevel(self.level)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))


def run_variant(variant: str, name: str, m: int, iters: int) -> dict[str, Any]:
    """Build the model afresh, run `variant` cold, then time its steady state.  The CUDA-graph
    variants reuse their base variant's caches and store (their first run is not a cold start)."""
    fresh_caches(f"{name}-m{m}-{variant.removesuffix('_graph')}")
    torch._dynamo.reset()
    gemmtune.clear_dispatch_cache()
    model, inputs = build(name, m)
    rec: dict[str, Any] = {"model": name, "M": m, "variant": variant}
    with torch.no_grad():
        fn, rec["first_s"], extra = prepare(variant, model, inputs)
        rec.update(extra)
        out = fn()
        rec.update(steady(fn, iters))
    rec["out"] = out.detach().float().cpu()
    del model, fn
    torch.cuda.empty_cache()
    return rec


def guarded(variant: str, name: str, m: int, iters: int) -> dict[str, Any]:
    """`run_variant`, with a failure recorded (and the run going on) instead of raised."""
    try:
        return run_variant(variant, name, m, iters)
    except Exception as exc:  # noqa: BLE001 - one variant's failure is a result, not the end of the run
        import traceback

        traceback.print_exc()
        torch.cuda.empty_cache()
        return {"model": name, "M": m, "variant": variant, "error": f"{type(exc).__name__}: {exc}"[:500]}


def prepare(variant: str, model: nn.Module, inputs: tuple) -> tuple[Callable[[], torch.Tensor], float, dict]:
    """The callable to time for `variant`, its first-run seconds, and variant-specific facts."""
    extra: dict[str, Any] = {}
    plain = lambda: output_of(model, inputs)  # noqa: E731
    if variant in ("eager", "eager_graph"):
        _, first = first_call(plain)
        return (graphed(plain) if variant == "eager_graph" else plain), first, extra
    if variant in ("gemmtune", "gemmtune_graph"):
        t0 = time.perf_counter()
        # Under a CUDA graph launch cost does not count: the tuned picks run there, unchecked in the model.
        with Stamped() as stamped:
            report = gemmtune.warmup(model, *inputs, progress=False, in_model=variant == "gemmtune")
        _, fwd = first_call(plain)
        first = time.perf_counter() - t0
        extra.update(facts=selection_facts(), timeline=stamped.lines, load=os.getloadavg())
        extra.update(problems=len(report.rows), warmup_s=report.seconds, tuned=report.tuned,
                     check_s=report.check_s, picks={r.problem: r.winner for r in report.rows},
                     runs={r.problem: r.runs for r in report.rows},
                     in_model={r.problem: round(r.in_model.ratio, 4) for r in report.rows if r.in_model})
        if variant == "gemmtune":
            extra["second_start_s"] = second_start(model, inputs)
        return (graphed(plain) if variant == "gemmtune_graph" else plain), first, extra
    if variant == "inductor_gemmtune":
        return prepare_inductor_gemmtune(model, inputs)
    if variant == "inductor":
        with probe() as counted:
            compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
            fn = lambda: output_of(compiled, inputs)  # noqa: E731
            _, first = first_call(fn)
        return fn, first, {"benchmarked": counted.choices, "autotuned": counted.autotuned}
    if variant == "inductor_default":
        compiled = torch.compile(model)
    elif variant == "gemmtune_compile":
        compiled = torch.compile(gemmtune.patch(model))
    else:
        raise SystemExit(f"--variants: unknown variant {variant!r}")
    fn = lambda: output_of(compiled, inputs)  # noqa: E731
    _, first = first_call(fn)
    return fn, first, extra


def probe() -> Any:
    """`gemmtune.inductor.benchmark_probe()` where torch has the lookup table, else a no-op counter."""
    import contextlib
    from types import SimpleNamespace

    import gemmtune.inductor as gi

    if gi.available():
        return gi.benchmark_probe()
    return contextlib.nullcontext(SimpleNamespace(choices=None, autotuned=None))


def prepare_inductor_gemmtune(model: nn.Module, inputs: tuple) -> tuple[Callable[[], torch.Tensor], float, dict]:
    """Inductor fed by gemmtune: cold (empty store), then warm (new Inductor caches, the store kept)."""
    import gemmtune.inductor as gi
    from gemmtune import engine

    extra: dict[str, Any] = {}
    fn: Callable[[], torch.Tensor] = lambda: output_of(model, inputs)  # noqa: E731
    for phase in ("cold", "warm"):
        if phase == "warm":  # a second start of the program: nothing compiled, the store on disk
            torch._dynamo.reset()
            engine._STORES.clear()
            for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
                d = Path(os.environ[var]).with_name(var.lower() + "_warm")
                d.mkdir(parents=True, exist_ok=True)
                os.environ[var] = str(d)
        with gi.installed() as handler, gi.benchmark_probe() as counted:
            compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
            fn = lambda c=compiled: output_of(c, inputs)  # noqa: E731
            _, first = first_call(fn)
        prefix = "" if phase == "cold" else "warm_"
        extra.update({f"{prefix}first_s": first, f"{prefix}tuned": handler.stats["tuned"],
                      f"{prefix}store_hits": handler.stats["store_hit"], f"{prefix}benchmarked": counted.choices,
                      f"{prefix}autotuned": counted.autotuned, f"{prefix}stats": dict(handler.stats)})
    return fn, extra.pop("first_s"), extra


def second_start(model: nn.Module, inputs: tuple) -> float:
    """Warm-up time of a second run of the program: nothing dispatched yet, the store on disk."""
    from gemmtune import engine

    gemmtune.clear_dispatch_cache()
    engine._STORES.clear()
    t0 = time.perf_counter()
    report = gemmtune.warmup(model, *inputs, progress=False)
    assert report.tuned == 0, f"second start tuned {report.tuned} problems"
    return time.perf_counter() - t0


VARIANTS = ("eager", "eager_graph", "gemmtune", "gemmtune_graph", "inductor", "gemmtune_compile")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", default="1,16,64,128,512,4096", help="token counts, comma-separated")
    p.add_argument("--models", default="stack,llama")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default="models.json")
    args = p.parse_args(argv)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
    rows: list[dict] = []
    for m in (int(v) for v in args.m.split(",")):
        for name in args.models.split(","):
            recs = [guarded(v, name, m, args.iters) for v in args.variants.split(",")]
            ref = next((r["out"] for r in recs if "out" in r), None)
            for r in recs:
                if "out" in r:
                    r["rel_err_vs_first"] = rel_err(r.pop("out"), ref)
                print(json.dumps({k: v for k, v in r.items() if k not in ("picks", "facts", "timeline")}), flush=True)
                for f in r.get("facts", []):
                    print(f"  {f['problem']}: {f['winner']} tune {f['tuning_s']:.2f} s (compile {f['compile_s']:.2f} s, "
                          f"{f['binaries']} binaries, prescreen {f['prescreen_s']:.2f} s, final {f['final_s']:.2f} s)")
            rows += recs
            # written after every model and M, so a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print_table(rows, meta)
    return 0


def print_table(rows: list[dict], meta: dict) -> None:
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']}: ms per forward (first-run s)")
    shown = [*VARIANTS, *sorted({r["variant"] for r in rows} - set(VARIANTS))]
    print("| model | M | " + " | ".join(shown) + " |")
    print("|---|---|" + "---|" * len(shown))
    keys = sorted({(r["model"], r["M"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for model, m in keys:
        cells = []
        for v in shown:
            r = next((r for r in rows if (r["model"], r["M"], r["variant"]) == (model, m, v)), None)
            if r is None or "error" in r:
                cells.append("-" if r is None else "error")
            else:
                cells.append(f"{r['ms']:.3f} ({r['first_s']:.1f})")
        print(f"| {model} | {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
