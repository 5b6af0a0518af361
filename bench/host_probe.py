"""Where a compiled forward's host time goes: the variants of bench/protocol.py compiled in this one
process (fresh caches), side by side.

For each variant it records:
- Inductor's output code (every graph it compiled), written to OUT_DIR/<variant>.py;
- Dynamo's cache entries on the frame's code object and the guard tree's size, and the guards' own
  time per call (`guard_manager.check` on the frame's locals, timed alone, only where that check
  passes: on the H200 it did not, so no guard time was read);
- host microseconds per call (the loop's wall clock before the synchronize: what the launches cost
  when the GPU keeps up) and the whole call, in `--rounds` shuffled rounds of `--iters` calls;
- one cProfile of `--profile-calls` calls: the functions with the most own time, per call.

    python bench/host_probe.py --case stack:1 --variants max_autotune,max_autotune_fed,gemmtune --out host.json
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import pstats
import random
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any, Callable
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import model_rounds  # noqa: E402
import models  # noqa: E402  (new Triton, Inductor and gemmtune caches for this process)
import protocol  # noqa: E402
import torch  # noqa: E402

import gemmtune  # noqa: E402


def _dynamo_facts(fn: Callable[[], Any], inputs: tuple) -> dict[str, Any]:
    """The frame's compiled entries, guard lines and guard time per check (µs), found through the
    closure of the protocol's callable (`output_of(compiled, inputs)`)."""
    compiled = next((c.cell_contents for c in fn.__closure__ or () if hasattr(c.cell_contents,
                                                                           "_torchdynamo_orig_callable")), None)
    if compiled is None:
        return {}
    code = compiled._torchdynamo_orig_callable.__code__
    entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list(code)
    out: dict[str, Any] = {"entries": len(entries)}
    if entries:
        gm = entries[0].guard_manager
        f_locals = {"args": inputs}
        out["guard_lines"] = len(str(gm).splitlines())
        out["guards_pass"] = bool(gm.check(f_locals))
        if out["guards_pass"]:  # a failing check may stop early: its time is not the guards' cost
            n = 2000
            out["guard_us"] = round(timeit.timeit(lambda: gm.check(f_locals), number=n) / n * 1e6, 2)
    return out


def compile_variant(variant: str, base: Any, inputs: tuple,
                    train: bool = False) -> tuple[Callable[[], Any], dict[str, Any]]:
    """One variant compiled and warmed up (with `train`, its training step: forward, loss and
    backward, as bench/protocol.py times it); its output code, Dynamo facts and handler counts."""
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    model = copy.deepcopy(base).train(train)
    grad = torch.enable_grad if train else torch.no_grad
    t0 = time.perf_counter()
    with grad(), mock.patch.object(GraphLowering, "save_output_code", codes.append, create=True):
        fn, made = protocol.compiled_variant(variant, model, inputs, torch, gemmtune)
        fn = protocol._train_step(fn, model) if train else fn
        for _ in range(3):  # a training step's backward graph is compiled in its first backward
            fn()
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    import gemmtune.inductor as gi

    while gi.installer._PRIOR:
        gi.uninstall()
    handler = made.get("handler")
    facts = {"compile_s": round(compile_s, 2), "graphs": len(codes), "code": "\n\n# ---- next graph ----\n\n".join(codes),
             **({"handler": dict(handler.stats), "built": [list(map(str, b)) for b in handler.built]}
                if handler is not None else {}),
             **_dynamo_facts(fn if not train else lambda: None, inputs)}
    facts["launches_in_code"] = facts["code"].count(".run(")
    return fn, facts


def host_round(fn: Callable[[], Any], iters: int) -> tuple[float, float]:
    """(host µs per call before the synchronize, µs per call to the end of the GPU's work)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / iters * 1e6, (time.perf_counter() - t0) / iters * 1e6


def profile(fn: Callable[[], Any], calls: int, top: int) -> dict[str, Any]:
    """cProfile over `calls` calls: total µs per call and the `top` functions by own time (µs per call)."""
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    rows = [(f"{Path(k[0]).name}:{k[1]}:{k[2]}", v[1], v[2], v[3]) for k, v in stats.stats.items()]  # type: ignore[attr-defined]
    rows.sort(key=lambda r: -r[2])
    total = sum(r[2] for r in rows)
    return {"total_us": round(total / calls * 1e6, 1),
            "top": [[name, round(n / calls, 2), round(own / calls * 1e6, 2), round(cum / calls * 1e6, 2)]
                    for name, n, own, cum in rows[:top]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default="stack:1", help="MODEL:M (bench/models.py's models)")
    p.add_argument("--variants", default="max_autotune,max_autotune_fed,gemmtune,gemmtune_gemv")
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--profile-calls", type=int, default=200)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--train", action="store_true", help="each variant's training step instead of its forward")
    p.add_argument("--out", default="host_probe.json", help="JSON path; the output code goes beside it (STEM_VARIANT.py)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_probe: needs a CUDA device", file=sys.stderr)
        return 2
    name, m = args.case.split(":")
    base, inputs = models.build(name, int(m))
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                       "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)},
                              "variants": {}}
    fns = {}
    for v in args.variants.split(","):
        fns[v], facts = compile_variant(v, base, inputs, args.train)
        (out_path.parent / f"{out_path.stem}_{v}.py").write_text(facts.pop("code"))
        result["variants"][v] = facts
        print(v, json.dumps(facts), flush=True)
        out_path.write_text(json.dumps(result, indent=1))
    times = timed_rounds(fns, args.rounds, args.iters, args.train)
    for v, fn in fns.items():
        with torch.enable_grad() if args.train else torch.no_grad():
            result["variants"][v].update(times[v], profile=profile(fn, args.profile_calls, args.top),
                                         kernels=model_rounds.kernel_split(fn))
    out_path.write_text(json.dumps(result, indent=1))
    print_table(result)
    return 0


def timed_rounds(fns: dict[str, Callable[[], Any]], rounds: int, iters: int,
                 train: bool = False) -> dict[str, dict[str, float]]:
    """Shuffled rounds; per variant the median host and whole µs per call, and the medians of the
    per-round host difference and whole-call ratio to the first variant."""
    host: dict[str, list[float]] = {v: [] for v in fns}
    whole: dict[str, list[float]] = {v: [] for v in fns}
    order = list(fns)
    with torch.enable_grad() if train else torch.no_grad():
        for _ in range(rounds):
            random.shuffle(order)
            for v in order:
                h, w = host_round(fns[v], iters)
                host[v].append(h)
                whole[v].append(w)
    ref = next(iter(fns))
    return {v: {"host_us": round(statistics.median(host[v]), 2), "whole_us": round(statistics.median(whole[v]), 2),
                "host_minus_first_us": round(statistics.median(a - b for a, b in zip(host[v], host[ref])), 2),
                "whole_x_first": round(statistics.median(a / b for a, b in zip(whole[v], whole[ref])), 4)}
            for v in fns}


def print_table(result: dict[str, Any]) -> None:
    print("| variant | graphs | entries | guard lines | guard µs | .run( in code | host µs | whole µs | "
          "host − first µs | whole × first | cProfile µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for v, f in result["variants"].items():
        print(f"| {v} | {f['graphs']} | {f.get('entries')} | {f.get('guard_lines')} | {f.get('guard_us')} | "
              f"{f['launches_in_code']} | {f.get('host_us')} | {f.get('whole_us')} | {f.get('host_minus_first_us')} | "
              f"{f.get('whole_x_first')} | {f.get('profile', {}).get('total_us')} |")


if __name__ == "__main__":
    sys.exit(main())
