"""Whole models under torch.compile and eager, by one protocol (bench/protocol.py), in one run.

Models (bf16 on CUDA, eval, batch 1 with M tokens, random weights, nothing downloaded):
- `stack`: 4 Llama-3-8B-shaped decoder layers: RMSNorm, qkv 4096->6144, causal
  `scaled_dot_product_attention` (32 query heads, 8 KV heads), o 4096->4096, RMSNorm, gate_up
  4096->28672, SiLU-and-multiply, down 14336->4096; `nn.Linear` without bias.
- `llama`: a `transformers` LlamaModel built from a config (Llama-3-8B dimensions, 2 layers).
- `tiny`: two 256-wide layers of the stack's shape, fp32 on CPU when there is no GPU (a dry run of
  the protocol).
- `--cpu-model 8,32,64`: the CPU case, fp32: two blocks of LayerNorm + qkv 512->1536, o 512->512,
  up 512->2048, down 2048->512 (`nn.Linear` with bias), batch rows each; `gemmtune.warmup` + eager
  against the plain eager model, alternated in rounds in one process (no torch.compile).

The protocol (bench/protocol.py says each variant): first calls, each in a fresh process with empty
Triton, Inductor and gemmtune caches (or the caches an earlier process of its group left: a second
start, a shared store); then the steady state of every variant interleaved in shuffled rounds in one
process, as ratios to max-autotune-no-cudagraphs.  JSON is written after every process.

    python bench/models.py --cases stack:1,stack:512,llama:64 --out models.json
    python bench/models.py --cases stack:64 --breakdown --train --out breakdown.json
    python bench/models.py --cases tiny:8 --first default,gemmtune --steady default,gemmtune --rounds 3
    python bench/models.py --cpu-model 8,32,64 --rounds 15 --out bench/results/models_cpu.json
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
    isolation = sys.modules.get("gemmtune.measure.isolation")  # not imported yet: no worker either
    if isolation is not None:
        isolation.shutdown_workers()
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "GEMMTUNE_CACHE_DIR"):
        d = SCRATCH / tag / var.lower()
        d.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(d)
    os.environ["GEMMTUNE_STORE"] = str(SCRATCH / tag / "store.db")


if not os.environ.get("GEMMTUNE_PROTOCOL_CHILD"):  # a protocol child keeps the caches its parent chose
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
    def __init__(self, hidden: int = HIDDEN):
        super().__init__()
        self.hidden, hd, ffn = hidden, hidden // HEADS, FFN * hidden // HIDDEN
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, (HEADS + 2 * KV_HEADS) * hd, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, m, _ = x.shape
        hidden, hd = self.hidden, self.hidden // HEADS
        q, k, v = self.qkv(self.norm1(x)).split([hidden, KV_HEADS * hd, KV_HEADS * hd], dim=-1)
        q = q.view(b, m, HEADS, hd).transpose(1, 2)
        k = k.view(b, m, KV_HEADS, hd).transpose(1, 2)
        v = v.view(b, m, KV_HEADS, hd).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=m > 1, enable_gqa=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, m, hidden))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def build(name: str, m: int) -> tuple[nn.Module, tuple]:
    """The model, built on the GPU in bf16 (random weights), and its example inputs for `m` tokens."""
    torch.manual_seed(0)
    if name in ("stack", "tiny"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        width = HIDDEN if name == "stack" else 256
        with torch.device(device):
            model = nn.Sequential(*[Layer(width) for _ in range(4 if name == "stack" else 2)]).to(dtype)
            x = (torch.randn(1, m, width) * 0.5).to(dtype)
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


def own_frame(model: Any, variant: str) -> Callable[..., Any]:
    """`model` called through a function with its own code object.  Dynamo keeps compiled programs
    per code object, and with nn.Module inlining a second `torch.compile` of an equal model in an
    equal mode reuses the first one's program: a fed compile after a plain one then never reaches
    gemmtune (seen on the H200: no pick was asked for).  Each compiled variant gets its own frame."""
    namespace: dict[str, Any] = {}
    exec(compile("def forward(*args):\n    return model(*args)\n", f"<variant {variant}>", "exec"),
         {"model": model}, namespace)
    return namespace["forward"]


class CpuBlock(nn.Module):
    """The CPU case's block: LayerNorm, qkv, a gate standing in for attention, o; LayerNorm, up, GELU, down."""

    def __init__(self, d: int = 512):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.o(q * torch.sigmoid(k) + v)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def cpu_model_case(batch: int, rounds: int, iters: int) -> dict[str, Any]:
    """warmup + eager over plain eager for the CPU model at `batch` rows: per-round ratios, alternated."""
    import copy

    torch.manual_seed(0)
    plain = nn.Sequential(CpuBlock(), CpuBlock()).eval()
    tuned, control = copy.deepcopy(plain), copy.deepcopy(plain)  # control: the plain model again (the noise)
    x = torch.randn(batch, 512)
    t0 = time.perf_counter()
    report = gemmtune.warmup(tuned, x, progress=False)
    warm_s = time.perf_counter() - t0

    def block(model: nn.Module) -> float:
        t = time.perf_counter()
        for _ in range(iters):
            model(x)
        return (time.perf_counter() - t) * 1e3 / iters

    ratios, controls, ms = [], [], {"plain": [], "warmup": [], "control": []}
    with torch.no_grad():
        for model in (plain, tuned, control, plain, tuned, control):
            block(model)
        for r in range(rounds):
            order = [("plain", plain), ("warmup", tuned), ("control", control)]
            got = {name: block(model) for name, model in (order if r % 2 == 0 else order[::-1])}
            for name in got:
                ms[name].append(got[name])
            ratios.append(got["warmup"] / got["plain"])
            controls.append(got["control"] / got["plain"])
        err = rel_err(tuned(x), plain(x))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    qc = statistics.quantiles(controls, n=4) if len(controls) > 1 else [controls[0]] * 3
    return {"case": f"cpu_model:{batch}", "warmup_s": warm_s, "picks": [(r.problem, r.runs) for r in report.rows],
            "plain_ms": statistics.median(ms["plain"]), "warmup_ms": statistics.median(ms["warmup"]),
            "ratio_median": statistics.median(ratios), "ratio_q1_q3": [q[0], q[2]], "rel_err": err,
            "control_median": statistics.median(controls), "control_q1_q3": [qc[0], qc[2]]}


def cpu_main(args: argparse.Namespace) -> int:
    """`--cpu-model`: the CPU case at each batch; a table and JSON."""
    meta = {"device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "rounds": args.rounds}
    cases = [cpu_model_case(int(b), args.rounds, args.iters) for b in args.cpu_model.split(",")]
    Path(args.out).write_text(json.dumps({"meta": meta, "cases": cases}, indent=1, default=str))
    print(f"\ncpu ({meta['threads']} threads), torch {meta['torch']}, {meta['date']}")
    print("| case | plain ms | warmup ms | warmup / plain (median) | q1-q3 | control / plain (q1-q3) | picks |")
    print("|---|---:|---:|---:|---|---|---|")
    for c in cases:
        picks = ", ".join(sorted({runs for _, runs in c["picks"]}))
        print(f"| {c['case']} | {c['plain_ms']:.3f} | {c['warmup_ms']:.3f} | {c['ratio_median']:.3f} | "
              f"{c['ratio_q1_q3'][0]:.3f}-{c['ratio_q1_q3'][1]:.3f} | {c['control_median']:.3f} "
              f"({c['control_q1_q3'][0]:.3f}-{c['control_q1_q3'][1]:.3f}) | {picks} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    import protocol

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="stack:1,stack:512,llama:64", help="MODEL:M, comma-separated")
    p.add_argument("--first", default=",".join(protocol.FIRST_DEFAULT), help="first-call variants ('' for none)")
    p.add_argument("--steady", default=",".join(protocol.STEADY), help="steady-state variants ('' for none)")
    p.add_argument("--breakdown", action="store_true", help="also the breakdown variants (protocol.BREAKDOWN)")
    p.add_argument("--train", action="store_true", help="also a training step (forward + backward)")
    p.add_argument("--kernels", action="store_true",
                   help="also each steady variant's GPU time by kernel kind (gemm, attention, triton, other)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--copies", type=int, default=1,
                   help="steady eager variants (eager*) on this many copies each, called in turn (layout noise)")
    p.add_argument("--first-timeout", type=float, default=300.0)
    p.add_argument("--steady-timeout", type=float, default=420.0)
    p.add_argument("--out", default="models.json")
    p.add_argument("--root", default="", help="the caches' directory (default: a new temporary one); a run with "
                   "--first '' and the root of an earlier run times the steady state of that run's first calls")
    p.add_argument("--cpu-model", default="", help="the CPU case at these batch sizes (e.g. 8,32,64) instead of --cases")
    args = p.parse_args(argv)
    if args.cpu_model:
        return cpu_main(args)
    first = [v for v in args.first.split(",") if v] + (list(protocol.BREAKDOWN) if args.breakdown else [])
    steady = [v for v in args.steady.split(",") if v] + (list(protocol.STEADY_BREAKDOWN) if args.breakdown else [])
    meta = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
            "rounds": args.rounds, "iters": args.iters, "copies": args.copies}
    cases: list[dict] = []

    def write(case: dict) -> None:  # after every process, so a run cut short keeps what it measured
        Path(args.out).write_text(json.dumps({"meta": meta, "cases": [*cases, case]}, indent=1, default=str))

    for case in args.cases.split(","):
        cases.append(protocol.run_case(case, first, steady, Path(args.root) if args.root else SCRATCH, args, write))
        Path(args.out).write_text(json.dumps({"meta": meta, "cases": cases}, indent=1, default=str))
    print_tables(cases, meta)
    return 0


def print_tables(cases: list[dict], meta: dict) -> None:
    """The first calls (s, benchmarks) and the steady state (ms, ratio to max-autotune) as Markdown."""
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']}")
    print("| case | variant | first call s | Inductor benchmarks | gemmtune handler |")
    print("|---|---|---|---|---|")
    for c in cases:
        for r in c["first"]:
            cell = r.get("error") or f"{r['first_s']:.1f}"
            print(f"| {c['case']} | {r['variant']} | {cell} | {r.get('benchmarked', '-')} | {r.get('handler', '-')} |")
    print("\n| case | variant | ms per call | x max-autotune (median of rounds) | q1-q3 | x eager (q1-q3) | rel. err |")
    print("|---|---|---|---|---|---|---|")
    for c in cases:
        for r in c["steady"]:
            if "error" in r:
                print(f"| {c['case']} | - | {r['error']} | | | | |")
                continue
            q, qe = r["ratio_q1_q3"], r.get("ratio_vs_eager_q1_q3")
            err = "-" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
            vs_eager = f"{r['ratio_vs_eager']:.3f} ({qe[0]:.3f}-{qe[1]:.3f})" if qe else "-"
            print(f"| {c['case']} | {r['variant']} | {r['ms']:.3f} | {r['ratio_vs_max_autotune']:.3f} | "
                  f"{q[0]:.3f}-{q[1]:.3f} | {vs_eager} | {err} |")
    split = [(c["case"], r) for c in cases for r in c["steady"] if "kernels" in r]
    if split:
        print("\n| case | variant | GPU ms per call: gemm | attention | triton | other | kernels per call |")
        print("|---|---|---|---|---|---|---|")
        for case, r in split:
            k = r["kernels"]["ms"]
            print(f"| {case} | {r['variant']} | " + " | ".join(f"{k.get(n, 0.0):.4f}" for n in
                  ("gemm", "attention", "triton", "other")) + f" | {r['kernels']['kernels']:.0f} |")


if __name__ == "__main__":
    raise SystemExit(main())
