"""The model protocol: first calls in fresh processes with empty caches, steady state interleaved in one.

`python bench/models.py` runs it (this module holds the variants and the two kinds of child process).
A case is `MODEL:M` (bench/models.py's models: `stack`, `llama`).  Per case:

1. **First calls**, each in a fresh Python process whose Triton, Inductor and gemmtune caches are new
   directories (`first` variants below), or kept from an earlier process of the same group:
   - `default`: `torch.compile(model)`;  `max_autotune`: mode "max-autotune-no-cudagraphs";
   - `max_autotune_again`: a second program start of it, every cache kept;
   - `gemmtune`: `gemmtune.inductor.install()` then `torch.compile(model)` (default mode): every GEMM
     tuned by gemmtune (empty store) and built by Inductor from the pick;
   - `gemmtune_store`: the same on a new machine that shares the store: new Inductor and Triton
     caches, the store of `gemmtune` kept;  `gemmtune_again`: a second start, every cache kept;
   - `gemmtune_noprologue`: `gemmtune` with Inductor's prologue fusion off (`prologue_fusion`: no
     pointwise producer, such as RMSNorm's scaling, is fused into a GEMM template's loads);
   - `gemmtune_gemv`: `gemmtune` with `install(gemv=True)`: a matrix-vector mm becomes a reduction
     tuned by coordinate descent too, as in max-autotune (`gemmtune.inductor.gemv`); `gemmtune_mm`:
     `install(gemv=False)`, it stays a GEMM;
   - `gemmtune_pipeline`: `gemmtune` with `install(pipeline=True)`: the graph's new problems timed
     together by Inductor's pipelined GEMM autotuning (`gemmtune.inductor.pipeline`);
     `gemmtune_pipeline_store`: its warm store;
   - `gemmtune_warmup`: `gemmtune.warmup(model, x, for_compile=True)` then `torch.compile(model)`;
   - `eager_warmup`: `gemmtune.warmup(model, x)` then an eager forward; `eager_warmup_store`: again
     with its store (a warm-store warm-up); `eager_warmup_shared` and `eager_warmup_shared_store`: the
     same two with `GEMMTUNE_SHARE_KERNELS=1` (the picks' compiled kernels kept in the store too);
   - breakdown (with `--breakdown`): `default_cd` (default + coordinate-descent tuning) and
     `autotune_gemm` (default + Inductor's GEMM autotuning, `max_autotune_gemm`).
   Each records the seconds from `torch.compile` (or the warm-up) to the end of the first forward, the
   choices Inductor benchmarked (`benchmark_probe`) and gemmtune's handler counts.
2. **Steady state**, in one process: every variant compiled again from the caches of its first call,
   then timed in `--rounds` shuffled rounds of `--iters` forwards (CUDA events); ratios are medians of
   per-round ratios to `max_autotune`, so drift that hits a round hits every variant; an eager variant
   also gets its paired per-round ratio to plain `eager` (`ratio_vs_eager`: the eager target's reading),
   and every row keeps its per-round ms (`round_ms`).  `eager_warmup` releases the layers whose problems
   all run torch's op (the default); `eager_warmup_patched` (steady only, from `eager_warmup`'s store) keeps
   every layer patched (`release=False`); `eager_copy` (steady only) is plain eager on its own copy of
   the model, the A/A control of those ratios (two copies running the same code); `eager_late` (steady
   only) is the same control on a copy made after the variants listed before it were set up (listed
   last: after the warm-ups' tuning, as `eager_warmup_patched`'s copy is); `eager_closure` (steady only,
   no gemmtune) gives every `nn.Linear` an instance forward that calls `F.linear` on its parameter dict,
   as a patched layer's warm path does: what an instance-level forward costs by itself;
   `eager_subclass` (steady only, no gemmtune) gives each `nn.Linear` a subclass with that forward at
   class level instead; `eager_lean` gives each the forward a warm-up releases a layer to.  With `--train`
   also one training step (forward, loss, backward) per call for `default`, `max_autotune` and
   `gemmtune`, in a second process after the forward one (caches new for these: a training compile is
   not a first-call target).  `--root DIR` keeps the caches in DIR: a later run with `--first ''` and
   the same root times the steady state of the first calls an earlier run made.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent

# variant -> (cache group, phase): a phase "new" gets new directories for the group; "store" new
# Triton/Inductor directories beside the group's store; "keep" every directory of the group as left.
FIRST = {
    "default": ("default", "new"), "max_autotune": ("ma", "new"), "max_autotune_again": ("ma", "keep"),
    "gemmtune": ("gt", "new"), "gemmtune_store": ("gt", "store"), "gemmtune_again": ("gt", "keep"),
    "gemmtune_warmup": ("gw", "new"), "eager_warmup": ("ew", "new"), "eager_warmup_store": ("ew", "store"),
    "default_cd": ("cd", "new"), "autotune_gemm": ("ag", "new"), "gemmtune_gemv": ("gv", "new"),
    "gemmtune_mm": ("gm", "new"), "gemmtune_noprologue": ("gn", "new"),
    "eager_warmup_shared": ("es", "new"), "eager_warmup_shared_store": ("es", "store"),
    "gemmtune_pipeline": ("gp", "new"), "gemmtune_pipeline_store": ("gp", "store"),
}
SHARED = ("es",)  # groups whose store keeps the picks' compiled kernels (share_kernels)
BREAKDOWN = ("default_cd", "autotune_gemm")
FIRST_DEFAULT = ("default", "max_autotune", "max_autotune_again", "gemmtune", "gemmtune_store", "gemmtune_again",
                 "gemmtune_warmup", "eager_warmup", "eager_warmup_store", "eager_warmup_shared",
                 "eager_warmup_shared_store")
STEADY = ("eager", "eager_warmup", "default", "max_autotune", "gemmtune", "gemmtune_warmup")
STEADY_BREAKDOWN = ("default_cd", "autotune_gemm", "max_autotune_fed", "gemmtune_traced")
TRAIN = ("default", "max_autotune", "gemmtune")
STEADY_GROUP = {"eager_warmup_patched": "ew"}  # steady-only variants timed from another variant's caches


def cache_env(root: Path, group: str, phase: str) -> dict[str, str]:
    """The cache variables of a first-call process (see FIRST)."""
    base = root / group
    tag = {"new": "", "store": "_store", "keep": ""}[phase]
    env = {}
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "GEMMTUNE_CACHE_DIR"):
        d = base / (var.lower() + (tag if var != "GEMMTUNE_CACHE_DIR" else ""))
        d.mkdir(parents=True, exist_ok=True)
        env[var] = str(d)
    env["GEMMTUNE_STORE"] = str(base / "store.db")
    env["GEMMTUNE_SHARE_KERNELS"] = "1" if group in SHARED else "0"
    return env


_PROLOGUE: bool | None = None  # Inductor's prologue_fusion as the installed torch sets it


def compiled_variant(variant: str, model: Any, inputs: tuple, torch: Any, gemmtune: Any) -> tuple[Callable, dict]:
    """The callable of one variant (compiled, warmed up) and what it reports; nothing run yet."""
    import gemmtune.inductor as gi
    from models import output_of, own_frame

    facts: dict[str, Any] = {}
    mode = {"max_autotune": "max-autotune-no-cudagraphs", "max_autotune_again": "max-autotune-no-cudagraphs",
            "max_autotune_fed": "max-autotune-no-cudagraphs"}.get(variant)
    if variant in ("eager", "eager_copy", "eager_late"):  # the A/A controls: plain eager on another copy
        return (lambda: output_of(model, inputs)), facts
    if variant in ("eager_closure", "eager_subclass", "eager_lean"):
        from linear_variants import set_forwards

        facts["layers"] = set_forwards(model, variant.removeprefix("eager_"))
        return (lambda: output_of(model, inputs)), facts
    if variant.startswith("eager_warmup"):
        report = gemmtune.warmup(model, *inputs, progress=False, release=variant != "eager_warmup_patched")
        facts.update(tuned=report.tuned, problems=len(report.rows), warmup_s=report.seconds,
                     forward_s=round(report.forward_s, 3), check_s=round(report.check_s, 3),
                     winners=sorted({r.winner for r in report.rows}), runs=sorted({r.runs for r in report.rows}),
                     released=len(report.released))
        return (lambda: output_of(model, inputs)), facts
    from torch._inductor import config as inductor_config

    inductor_config.coordinate_descent_tuning = variant == "default_cd"
    inductor_config.max_autotune_gemm = variant == "autotune_gemm"
    global _PROLOGUE
    if _PROLOGUE is None:
        _PROLOGUE = inductor_config.prologue_fusion  # the installed torch's default
    inductor_config.prologue_fusion = _PROLOGUE and not variant.endswith("_noprologue")
    if variant.startswith("gemmtune") or variant == "max_autotune_fed":
        os.environ["GEMMTUNE_COMPILE_PATH"] = "traced" if variant == "gemmtune_traced" else "inductor"
        if variant in ("gemmtune_warmup", "gemmtune_traced"):
            report = gemmtune.warmup(model, *inputs, progress=False, for_compile=True)
            facts.update(tuned=report.tuned, problems=len(report.rows))
        else:
            facts["handler"] = gi.install(gemv={"gemmtune_gemv": True, "gemmtune_mm": False}.get(variant, "autotune"),
                                          pipeline=variant.startswith("gemmtune_pipeline"))
    compiled = torch.compile(own_frame(model, variant), mode=mode)
    return (lambda: output_of(compiled, inputs)), facts


def first_child(model_name: str, m: int, variant: str) -> dict[str, Any]:
    """One first call in this fresh process (the parent set the cache variables)."""
    t_import = time.perf_counter()
    sys.path.insert(0, str(HERE))
    import torch
    import gemmtune
    import gemmtune.inductor as gi
    from models import build

    imported = time.perf_counter() - t_import
    model, inputs = build(model_name, m)
    _sync(torch)
    with torch.no_grad(), gi.benchmark_probe() as probe, _profiled(variant):
        t0 = time.perf_counter()
        fn, facts = compiled_variant(variant, model, inputs, torch, gemmtune)
        fn()
        _sync(torch)
        first = time.perf_counter() - t0
    handler = facts.pop("handler", None)
    if handler is None and gi.available():
        from torch._inductor.virtualized import V

        handler = V.choices if gi.installer.is_gemmtune_handler(V.choices) else None
    out = {"model": model_name, "M": m, "variant": variant, "first_s": round(first, 3), "import_s": round(imported, 3),
           "benchmarked": probe.choices, "autotuned": probe.autotuned, **facts}
    if handler is not None:
        out["handler"] = dict(handler.stats)
        from gemmtune.inductor import kernel_configs

        out["kernel_configs"] = kernel_configs.report()
    return out


@contextlib.contextmanager
def _profiled(variant: str) -> Any:
    """With BENCH_PROFILE_DIR=DIR, the first call under cProfile: DIR/VARIANT.txt gets the 60
    functions of most cumulative time and Dynamo's compile-time table (where a first call's time goes)."""
    where = os.environ.get("BENCH_PROFILE_DIR")
    if not where:
        yield
        return
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(60)
        import torch._dynamo.utils as dynamo_utils

        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"{variant}.txt").write_text(text.getvalue() + "\n" + str(dynamo_utils.compile_times(repr="str")))


def _sync(torch: Any) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_round(fn: Callable[[], Any], iters: int, torch: Any) -> float:
    """ms per call over `iters` calls back to back (CUDA events, bench/model_rounds.py; wall clock
    without a GPU)."""
    if torch.cuda.is_available():
        import model_rounds

        return model_rounds.time_round(fn, iters)[0]
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def _train_step(compiled: Callable[[], Any], model: Any) -> Callable[[], Any]:
    def step() -> Any:
        loss = compiled().float().pow(2).mean()
        loss.backward()
        for p in model.parameters():
            p.grad = None
        return loss

    return step


def steady_variants(model_name: str, m: int, variants: list[str], root: Path, train: bool,
                    torch: Any, gemmtune: Any, facts: dict[str, dict] | None = None,
                    copies: int = 1) -> dict[str, Callable[[], Any]]:
    """Every variant of the steady-state process, each on its own copy of the model, compiled from the
    caches its first call left (`root`), warmed up; what each reports goes into `facts` by variant
    (a warm-up's winners, what runs after its in-model check, the layers it released).  An eager
    variant runs on `copies` copies, one after the other call by call: one copy's memory layout alone
    moved a reading by about 1 % (bench/linear_forward_cost.py)."""
    from models import build

    base, inputs = build(model_name, m)
    fns: dict[str, Callable[[], Any]] = {}
    plan = [(v, False) for v in variants] + [(v, True) for v in (TRAIN if train else ())]
    for variant, training in plan:
        n = copies if variant.startswith("eager") and not training else 1
        made = [_set_up(variant, training, base, inputs, root, torch, gemmtune, facts) for _ in range(n)]
        fns[variant + ("+train" if training else "")] = made[0] if n == 1 else _in_turn(made)
    return fns


def _in_turn(fns: list[Callable[[], Any]]) -> Callable[[], Any]:
    """One callable that calls `fns` in turn, one per call."""
    turn = itertools.cycle(fns)
    return lambda: next(turn)()


def _set_up(variant: str, training: bool, base: Any, inputs: tuple, root: Path, torch: Any, gemmtune: Any,
            facts: dict[str, dict] | None) -> Callable[[], Any]:
    """One copy of `base` set up as `variant` (from its caches under `root`), called 3 times."""
    from gemmtune.store.locations import forget_stores

    group = STEADY_GROUP.get(variant) or FIRST.get(variant, (variant, "new"))[0]
    os.environ.update(cache_env(root, group + ("_train" if training else ""), "keep"))
    forget_stores()
    model = copy.deepcopy(base).train(training)
    with torch.no_grad() if not training else torch.enable_grad():
        fn, told = compiled_variant(variant, model, inputs, torch, gemmtune)
        if facts is not None and told and not training:
            facts[variant] = {k: v for k, v in told.items() if k != "handler"}
        fn = _train_step(fn, model) if training else fn
        for _ in range(3):
            fn()
    _sync(torch)
    if variant.startswith("gemmtune") or variant == "max_autotune_fed":
        import gemmtune.inductor as gi

        while gi.installer._PRIOR:
            gi.uninstall()
    return fn


def steady_child(model_name: str, m: int, variants: list[str], root: Path, rounds: int, iters: int,
                 train: bool, kernels: bool = False, copies: int = 1) -> list[dict[str, Any]]:
    """Interleaved rounds of every variant in this one process; per variant its median ms and the
    median of per-round ratios to max_autotune (forward) or max_autotune+train (training step).  With
    `kernels` (CUDA only) also each variant's GPU time per call by kernel kind, from torch.profiler
    after the rounds (`model_rounds.kernel_split`): where a variant's time differs, which kernels."""
    sys.path.insert(0, str(HERE))
    import torch
    import gemmtune
    from models import build, output_of, rel_err

    told: dict[str, dict] = {}
    fns = steady_variants(model_name, m, variants, root, train, torch, gemmtune, told, copies)
    base, inputs = build(model_name, m)
    with torch.no_grad():
        ref = output_of(base, inputs)
        errs = {v: rel_err(fn(), ref) for v, fn in fns.items() if not v.endswith("+train")}
    times: dict[str, list[float]] = {v: [] for v in fns}
    order = list(fns)
    for _ in range(rounds):
        random.shuffle(order)
        for v in order:
            ctx = torch.enable_grad() if v.endswith("+train") else torch.no_grad()
            with ctx:
                times[v].append(time_round(fns[v], iters, torch))
    split: dict[str, Any] = {}
    if kernels and torch.cuda.is_available():
        import model_rounds

        for v in order:
            with torch.enable_grad() if v.endswith("+train") else torch.no_grad():
                split[v] = model_rounds.kernel_split(fns[v])
    return [{"model": model_name, "M": m, "variant": v, **round_stats(v, times), "rel_err": errs.get(v),
             **({"kernels": split[v]} if v in split else {}), **({"facts": told[v]} if v in told else {})}
            for v in times]


def _paired(ms: list[float], ref: list[float] | None) -> tuple[float, list[float]]:
    """Median and quartiles (q1, q3) of the per-round ratios ms / ref; NaN without a reference."""
    ratio = [a / b for a, b in zip(ms, ref)] if ref else [float("nan")]
    return statistics.median(ratio), statistics.quantiles(ratio, n=4)[::2] if len(ratio) > 1 else ratio * 2


def round_stats(variant: str, times: dict[str, list[float]]) -> dict[str, Any]:
    """One variant's steady-state figures from every variant's per-round ms: its median ms, its per-round
    ratios to max-autotune (the training step's to max-autotune's step) and, for an eager variant
    where plain `eager` ran in the same rounds, its paired per-round ratios to plain eager.

    Example:
        >>> t = {"eager": [2.0, 2.2, 2.4], "eager_warmup": [1.8, 2.2, 2.4], "max_autotune": [1.0, 1.1, 1.2]}
        >>> r = round_stats("eager_warmup", t)
        >>> r["ms"], round(r["ratio_vs_max_autotune"], 3), r["ratio_vs_eager"]
        (2.2, 2.0, 1.0)
    """
    ms = times[variant]
    ref = "max_autotune+train" if variant.endswith("+train") else "max_autotune"
    ratio, quartiles = _paired(ms, times.get(ref))
    row: dict[str, Any] = {"ms": statistics.median(ms), "ratio_vs_max_autotune": ratio, "ratio_q1_q3": quartiles,
                           "round_ms": [round(t, 4) for t in ms]}
    if variant.startswith("eager") and "eager" in times:
        row["ratio_vs_eager"], row["ratio_vs_eager_q1_q3"] = _paired(ms, times["eager"])
    return row


def spawn(args: list[str], env: dict[str, str], timeout: float) -> Any:
    """Run `python bench/protocol.py ARGS` with `env` over this environment; its last stdout line, as JSON."""
    full = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "GEMMTUNE_PROTOCOL_CHILD": "1"}
    try:
        done = subprocess.run([sys.executable, str(HERE / "protocol.py"), *args], env=full, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    sys.stderr.write(done.stderr[-3000:])
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(("{", "["))]
    if done.returncode or not lines:
        return {"error": f"rc {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ''}"}
    return json.loads(lines[-1])


def run_case(case: str, first: list[str], steady: list[str], root: Path, opts: Any, write: Callable) -> dict:
    """One case: its first calls (each in its own process), then its steady-state process."""
    model_name, m = case.split(":")[0], int(case.split(":")[1])
    out: dict[str, Any] = {"case": case, "first": [], "steady": []}
    for variant in first:
        group, phase = FIRST[variant]
        rec = spawn(["first", model_name, str(m), variant], cache_env(root / case, group, phase), opts.first_timeout)
        rec.setdefault("variant", variant)
        out["first"].append(rec)
        print(json.dumps(rec), flush=True)
        write(out)
    # The forward variants, then the training steps, each in a process of its own: a training
    # compile cut short by a time limit leaves the forward rows written.
    for variants, train in ((steady, False), ([], True) if opts.train else ((), False)):
        if not variants and not train:
            continue
        rows = spawn(["steady", model_name, str(m), ",".join(variants), str(root / case), str(opts.rounds),
                      str(opts.iters), "1" if train else "0", "1" if getattr(opts, "kernels", False) else "0",
                      str(getattr(opts, "copies", 1))],
                     {}, opts.steady_timeout)
        out["steady"] += rows if isinstance(rows, list) else [rows]
        write(out)
    return out


if __name__ == "__main__":
    kind, model_arg, m_arg = sys.argv[1:4]
    if kind == "first":
        print(json.dumps(first_child(model_arg, int(m_arg), sys.argv[4]), default=str))
    else:
        variants_arg, root_arg, rounds_arg, iters_arg, train_arg, kernels_arg, copies_arg = sys.argv[4:11]
        print(json.dumps(steady_child(model_arg, int(m_arg), [v for v in variants_arg.split(",") if v], Path(root_arg),
                                      int(rounds_arg), int(iters_arg), train_arg == "1", kernels_arg == "1",
                                      int(copies_arg)), default=str))
