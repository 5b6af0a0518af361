"""The whole-model protocol's child processes, which bench/models.py starts: the models, the variants,
one first call in a fresh process, and the steady state of every variant in shuffled, interleaved rounds.

Models (random weights): `stack`, 4 Llama-3-8B-shaped decoder layers (bf16 on CUDA); `llama`, a 2-layer
`transformers` LlamaModel of Llama-3-8B dimensions; `gpt2`, `transformers` GPT-2 small with its LM head (vocabulary
50257: rows not whole 16 bytes), M tokens in 8 sequences; `tiny`, two 256-wide layers (fp32 without a GPU).
Variants: `eager`; `default` (`torch.compile`); `max_autotune` (mode max-autotune-no-cudagraphs);
`gemmtune` (`gemmtune.inductor.install()`, then `torch.compile`; `gemmtune_pipeline`: `pipeline=True`);
`gemmtune_warmup` (`gemmtune.warmup(for_compile=True)`, then `torch.compile`); `eager_warmup`
(`gemmtune.warmup`, then eager; `eager_warmup_patched`: `release=False`; `eager_warmup_padded`: `out_layout="padded"`;
`*_shared`: kernels in the store). `*_store`, `*_again`: from their group's caches; `eager_copy`, `eager_late`: A/A.
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

STARTED = time.perf_counter()
import torch  # noqa: E402  (its import is part of a first call's import_s)
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FFN = 4096, 32, 8, 14336
MAX_AUTOTUNE = "max-autotune-no-cudagraphs"
# variant -> (cache group, phase): "new" gets new directories for the group; "store" new Triton and
# Inductor directories beside the group's store; "keep" every directory of the group as it was left.
FIRST = {"default": ("default", "new"), "max_autotune": ("ma", "new"), "max_autotune_again": ("ma", "keep"),
         "gemmtune": ("gt", "new"), "gemmtune_store": ("gt", "store"), "gemmtune_again": ("gt", "keep"),
         "gemmtune_pipeline": ("gp", "new"), "gemmtune_warmup": ("gw", "new"),
         "eager_warmup": ("ew", "new"), "eager_warmup_store": ("ew", "store"),
         "eager_warmup_shared": ("es", "new"), "eager_warmup_shared_store": ("es", "store")}
RUN_SHARES = os.environ.get("GEMMTUNE_SHARE_KERNELS")  # as the run was started (cache_env writes the variable)
SHARED = ("es",)  # groups whose store keeps the picks' compiled kernels (GEMMTUNE_SHARE_KERNELS)
FIRST_DEFAULT = tuple(v for v in FIRST if v != "gemmtune_pipeline")
STEADY = ("eager", "eager_warmup", "default", "max_autotune", "gemmtune", "gemmtune_warmup")
CONTROLS = ("eager", "eager_copy", "eager_late")
STEADY_GROUP = {"eager_warmup_patched": "ew", "eager_warmup_padded": "ep"}  # steady-only variants: their cache group
TRAIN = ("default", "max_autotune", "gemmtune")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Layer(nn.Module):
    """RMSNorm, qkv, causal attention (grouped KV heads), o; RMSNorm, gate_up, SiLU-and-multiply, down."""

    def __init__(self, hidden: int = HIDDEN):
        super().__init__()
        self.hidden, hd, ffn = hidden, hidden // HEADS, FFN * hidden // HIDDEN
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, (HEADS + 2 * KV_HEADS) * hd, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate_up, self.down = nn.Linear(hidden, 2 * ffn, bias=False), nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, m, _ = x.shape
        hidden, hd = self.hidden, self.hidden // HEADS
        q, k, v = self.qkv(self.norm1(x)).split([hidden, KV_HEADS * hd, KV_HEADS * hd], dim=-1)
        q, k, v = (t.view(b, m, -1, hd).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=m > 1, enable_gqa=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, m, hidden))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def build(name: str, m: int) -> tuple[nn.Module, tuple]:
    """The model `name` in eval mode (random weights) and its example inputs for `m` tokens."""
    torch.manual_seed(0)
    if name in ("stack", "tiny"):
        device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
        width = HIDDEN if name == "stack" else 256
        with torch.device(device):
            model = nn.Sequential(*[Layer(width) for _ in range(4 if name == "stack" else 2)]).to(dtype)
            x = (torch.randn(1, m, width) * 0.5).to(dtype)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.02)
        return model.eval(), (x,)
    if name == "gpt2":  # its attention and MLP are Conv1D layers: only the LM head is an nn.Linear
        if m % 8:
            raise SystemExit(f"model_runs.py: gpt2 takes M tokens in 8 sequences: M must be a multiple of 8, got {m}")
        from transformers import GPT2Config, GPT2LMHeadModel
        with torch.device("cuda"):
            model = GPT2LMHeadModel(GPT2Config()).to(torch.bfloat16).eval()
        return model, (torch.randint(0, 50257, (8, m // 8), device="cuda"),)
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, num_hidden_layers=2, vocab_size=32000,
                      max_position_embeddings=8192, attn_implementation="sdpa", use_cache=False)
    with torch.device("cuda"):
        model = LlamaModel(cfg).to(torch.bfloat16).eval()
    return model, (torch.randint(0, cfg.vocab_size, (1, m), device="cuda"),)


def output_of(model: Any, inputs: tuple) -> torch.Tensor:
    out = model(*inputs)  # a transformers model's output (its hidden state, or an LM's logits), or the tensor
    return next((getattr(out, k) for k in ("last_hidden_state", "logits") if hasattr(out, k)), out)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error of `out` against `ref` (Frobenius norms).

        >>> rel_err(torch.ones(4), torch.ones(4))
        0.0
    """
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))


def own_frame(model: Any, variant: str) -> Callable[..., Any]:
    """`model` called through a function of its own code object (Dynamo keeps programs per code object)."""
    namespace: dict[str, Any] = {"model": model}
    exec(compile("def forward(*args):\n    return model(*args)\n", f"<variant {variant}>", "exec"), namespace)
    return namespace["forward"]


def cache_env(root: Path, group: str, phase: str) -> dict[str, str]:
    """The cache variables of a process of `group` in `phase` (see FIRST), under `root`."""
    base, tag = root / group, "_store" if phase == "store" else ""
    shared = RUN_SHARES or ("1" if group in SHARED else "0")  # the run's own choice first
    env = {"GEMMTUNE_STORE": str(base / "store.db"), "GEMMTUNE_SHARE_KERNELS": shared}
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "GEMMTUNE_CACHE_DIR"):
        d = base / (var.lower() + (tag if var != "GEMMTUNE_CACHE_DIR" else ""))
        d.mkdir(parents=True, exist_ok=True)
        env[var] = str(d)
    return env


def compiled_variant(variant: str, model: Any, inputs: tuple, gemmtune: Any) -> tuple[Callable, dict]:
    """The callable of one variant of `model` (compiled or warmed up, not yet called) and its facts."""
    facts: dict[str, Any] = {}
    if variant in CONTROLS:
        return (lambda: output_of(model, inputs)), facts
    if variant.startswith("eager_warmup"):
        report = gemmtune.warmup(model, *inputs, progress=False, release=variant != "eager_warmup_patched",
                                 out_layout="padded" if variant == "eager_warmup_padded" else None)
        facts.update(tuned=report.tuned, problems=len(report.rows), warmup_s=report.seconds,
                     forward_s=round(report.forward_s, 3), check_s=round(report.check_s, 3),
                     winners=sorted({r.winner for r in report.rows}), runs=sorted({r.runs for r in report.rows}),
                     released=len(report.released))
        return (lambda: output_of(model, inputs)), facts
    if variant == "gemmtune_warmup":
        report = gemmtune.warmup(model, *inputs, progress=False, for_compile=True)
        facts.update(tuned=report.tuned, problems=len(report.rows))
    elif variant.startswith("gemmtune"):
        import gemmtune.inductor as gi
        facts["handler"] = gi.install(pipeline=variant.startswith("gemmtune_pipeline"))
    mode = MAX_AUTOTUNE if variant.startswith("max_autotune") else None
    compiled = torch.compile(own_frame(model, variant), mode=mode)
    return (lambda: output_of(compiled, inputs)), facts


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def first_child(model_name: str, m: int, variant: str) -> dict[str, Any]:
    """One first call in this fresh process: seconds to the end of the first forward, Inductor's benchmarks."""
    import gemmtune
    import gemmtune.inductor as gi
    imported = time.perf_counter() - STARTED
    model, inputs = build(model_name, m)
    _sync()
    with torch.no_grad(), gi.benchmark_probe() as probe:
        t0 = time.perf_counter()
        fn, facts = compiled_variant(variant, model, inputs, gemmtune)
        fn()
        _sync()
        first = time.perf_counter() - t0
    handler = facts.pop("handler", None)
    if handler is None and gi.available():  # a warm-up for compile installs one of its own
        from torch._inductor.virtualized import V
        handler = V.choices if gi.installer.is_gemmtune_handler(V.choices) else None
    return {"model": model_name, "M": m, "variant": variant, "first_s": round(first, 3), "import_s": round(imported, 3),
            "benchmarked": probe.choices, "autotuned": probe.autotuned, **facts,
            **({"handler": dict(handler.stats)} if handler is not None else {})}


def time_round(fn: Callable[[], Any], iters: int) -> float:
    """ms per call over `iters` calls back to back: CUDA events, or the wall clock without a GPU."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def steady_variants(model_name: str, m: int, variants: list[str], root: Path, train: bool, gemmtune: Any,
                    facts: dict[str, dict], copies: int = 1) -> dict[str, Callable[[], Any]]:
    """Every variant, each on its own copy of the model set up from the caches its first call left under
    `root`; an eager variant on `copies` copies called in turn (a copy's memory layout moves a reading)."""
    base, inputs = build(model_name, m)
    fns: dict[str, Callable[[], Any]] = {}
    for variant, training in [(v, False) for v in variants] + [(v, True) for v in (TRAIN if train else ())]:
        n = copies if variant.startswith("eager") and not training else 1
        made = [_set_up(variant, training, base, inputs, root, gemmtune, facts) for _ in range(n)]
        turn = itertools.cycle(made)
        fns[variant + ("+train" if training else "")] = made[0] if n == 1 else (lambda t=turn: next(t)())
    return fns


def _set_up(variant: str, training: bool, base: Any, inputs: tuple, root: Path, gemmtune: Any,
            facts: dict[str, dict]) -> Callable[[], Any]:
    """One copy of `base` set up as `variant` from its caches under `root`, then called 3 times."""
    from gemmtune.store.locations import forget_stores
    group = STEADY_GROUP.get(variant) or FIRST.get(variant, (variant, "new"))[0]
    os.environ.update(cache_env(root, group + ("_train" if training else ""), "keep"))
    forget_stores()
    model = copy.deepcopy(base).train(training)
    with torch.enable_grad() if training else torch.no_grad():
        fn, told = compiled_variant(variant, model, inputs, gemmtune)
        if told and not training:
            facts[variant] = {k: v for k, v in told.items() if k != "handler"}
        if training:  # a step: forward, a loss, backward
            fn = functools.partial(_train_step, fn, model)
        for _ in range(3):
            fn()
    _sync()
    if variant.startswith("gemmtune"):
        import gemmtune.inductor as gi
        while gi.installer._PRIOR:
            gi.uninstall()
    return fn


def _train_step(forward: Callable[[], Any], model: Any) -> Any:
    loss = forward().float().pow(2).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss


def steady_child(model_name: str, m: int, variants: list[str], root: Path, rounds: int, iters: int,
                 train: bool, copies: int = 1) -> list[dict[str, Any]]:
    """Every variant timed in `rounds` shuffled rounds of `iters` calls; a row per variant (`round_stats`)."""
    import gemmtune
    told: dict[str, dict] = {}
    fns = steady_variants(model_name, m, variants, root, train, gemmtune, told, copies)
    base, inputs = build(model_name, m)
    with torch.no_grad():
        ref = output_of(base, inputs)
        errs = {v: rel_err(fn(), ref) for v, fn in fns.items() if not v.endswith("+train")}
    times, order = {v: [] for v in fns}, list(fns)
    for _ in range(rounds):
        random.shuffle(order)
        for v in order:
            with torch.enable_grad() if v.endswith("+train") else torch.no_grad():
                times[v].append(time_round(fns[v], iters))
    return [{"model": model_name, "M": m, "variant": v, **round_stats(v, times), "rel_err": errs.get(v),
             **({"facts": told[v]} if v in told else {})} for v in times]


def _paired(ms: list[float], ref: list[float] | None) -> tuple[float, list[float]]:
    """Median and quartiles (q1, q3) of the per-round ratios ms / ref; NaN without a reference."""
    ratio = [a / b for a, b in zip(ms, ref)] if ref else [float("nan")]
    return statistics.median(ratio), statistics.quantiles(ratio, n=4)[::2] if len(ratio) > 1 else ratio * 2


def round_stats(variant: str, times: dict[str, list[float]]) -> dict[str, Any]:
    """One variant's steady-state figures from every variant's per-round ms: its median ms, its per-round
    ratios to max-autotune (a training step's: to max-autotune's step) and, for an eager variant where
    plain `eager` ran in the same rounds, its paired per-round ratios to plain eager.

        >>> t = {"eager": [2.0, 2.2, 2.4], "eager_warmup": [1.8, 2.2, 2.4], "max_autotune": [1.0, 1.1, 1.2]}
        >>> r = round_stats("eager_warmup", t)
        >>> r["ms"], round(r["ratio_vs_max_autotune"], 3), r["ratio_vs_eager"]
        (2.2, 2.0, 1.0)
    """
    ms = times[variant]
    ratio, quartiles = _paired(ms, times.get("max_autotune+train" if variant.endswith("+train") else "max_autotune"))
    row: dict[str, Any] = {"ms": statistics.median(ms), "ratio_vs_max_autotune": ratio, "ratio_q1_q3": quartiles,
                           "round_ms": [round(t, 4) for t in ms]}
    if variant.startswith("eager") and "eager" in times:
        row["ratio_vs_eager"], row["ratio_vs_eager_q1_q3"] = _paired(ms, times["eager"])
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = p.add_subparsers(dest="kind", required=True)
    first, steady = sub.add_parser("first", help="one first call in this process"), sub.add_parser(
        "steady", help="the steady state of every variant, interleaved")
    for q in (first, steady):
        q.add_argument("model")
        q.add_argument("m", type=int)
    first.add_argument("variant", choices=sorted(FIRST))
    steady.add_argument("variants", help="comma-separated ('' for none: the training steps alone)")
    steady.add_argument("root", type=Path, help="the caches' directory of the case")
    for name, default in (("--rounds", 15), ("--iters", 10), ("--copies", 1)):
        steady.add_argument(name, type=int, default=default)
    steady.add_argument("--train", action="store_true", help="the training steps (forward + backward)")
    a = p.parse_args(argv)
    result = first_child(a.model, a.m, a.variant) if a.kind == "first" else steady_child(
        a.model, a.m, [v for v in a.variants.split(",") if v], a.root, a.rounds, a.iters, a.train, a.copies)
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
