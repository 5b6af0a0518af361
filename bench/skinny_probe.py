"""Small-M (decode) shapes: the L2-flush mode of the timer, the `triton_skinny` template, launch host cost.

For every shape of the suite with M <= `--max-m` (and the controls named by `--controls`):

1. tunes `triton_skinny` (and `triton_gemv` for M <= 4) exhaustively next to the library kernel
   (`gemmtune.engine.tune`, store off, in-process), which also checks every binary's numerics;
2. times cuBLAS and the best binary of each template interleaved, once with the timer's L2 flush
   by reading a 2x-L2 buffer ("read") and once by zeroing it ("write", Triton's do_bench);
3. measures the host time of one launch of the best skinny binary through the direct launch path
   and through Triton's JIT launch.

    python bench/skinny_probe.py --out probe.json          # on an H200

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))


def host_us(fn, calls: int = 200) -> float:
    """Median-free mean host microseconds per enqueue of `fn` (the GPU kept busy first)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e-3 * 1.98e9 * calls / 100))
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    return t * 1e6


def template_picks(op: str, tensors, templates, sel, row: dict) -> dict:
    """Each template's best config of the exhaustive tune `sel`, compiled and ready to time; its top
    five, pick and GPU time into `row` (and the skinny launch's host time, direct and through the JIT)."""
    from gemmtune.core.inputs import KernelInputs
    from gemmtune.templates.triton.launch import FastLaunch

    ki = KernelInputs.from_tensors(op, *tensors)
    fns = {}
    for tpl in templates:
        ok = [t for t in sel.timings if t.choice.template_uid == tpl.uid and t.status == "ok" and t.ms]
        if not ok:
            continue
        best = min(ok, key=lambda t: t.ms)
        row[f"{tpl.uid}_top5"] = [(t.choice.key, t.gpu_ms) for t in sorted(ok, key=lambda t: t.gpu_ms)[:5]]
        row[f"{tpl.uid}_choice"] = best.choice.key
        row[f"{tpl.uid}_tune_gpu_ms"] = best.gpu_ms
        launch = tpl.compile(best.choice, ki, tensors)
        out = launch(tensors)
        fns[tpl.uid] = (lambda launch=launch, out=out, rt=best.choice.runtime_dict: launch(tensors, out, **rt))
        if tpl.uid == "triton_skinny":
            row["skinny_host_us_fast"] = host_us(fns[tpl.uid])
            orig = FastLaunch.__call__
            FastLaunch.__call__ = lambda self, a: False
            try:
                row["skinny_host_us_jit"] = host_us(fns[tpl.uid])
            finally:
                FastLaunch.__call__ = orig
    return fns


def probe(spec, rounds: int, rep_ms: float, space: str = "default", which: str = "skinny,gemv") -> dict:
    from gemmtune.engine import tune
    from gemmtune.measure.timers import CudaTimer
    from gemmtune.core.settings import Settings
    from gemmtune.templates.extern import AtenTemplate
    from gemmtune.templates.triton.gemv import TritonGemvTemplate
    from gemmtune.templates.triton.skinny import TritonSkinnyTemplate

    tensors = spec.tensors("cuda")
    op = spec.op
    lib = {"mm": torch.mm, "bmm": torch.bmm}.get(op, torch.addmm)
    row = {"name": spec.name, "M": spec.M, "N": spec.N, "K": spec.K}
    fns = {"cublas": lambda: lib(*tensors)}
    if spec.M <= 256:
        templates = ([TritonSkinnyTemplate(size=space)] if "skinny" in which else []) + (
            [TritonGemvTemplate(size=space)] if spec.M <= 4 and "gemv" in which else [])
        settings = Settings(isolation="off", store="off", gpu_rep_ms=rep_ms, l2_flush="read")
        t0 = time.perf_counter()
        sel = tune(op, *tensors, strategy="exhaustive", settings=settings,
                   templates=[AtenTemplate(op)] + templates)
        row["tune_s"] = time.perf_counter() - t0
        row["bad"] = [(t.choice.key, t.status, t.detail[:120]) for t in sel.timings if t.status not in ("ok",)]
        fns.update(template_picks(op, tensors, templates, sel, row))
        row["cublas_host_us"] = host_us(fns["cublas"])
    names = list(fns)
    for flush in ("read", "write"):
        timer = CudaTimer(torch.device("cuda"), rep_ms, count_host=False, flush=flush)
        costs = timer.time_interleaved([fns[n] for n in names], rounds)
        for n, c in zip(names, costs):
            row[f"{n}_ms_{flush}"] = c.cost_ms
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default=str(ROOT / "bench" / "shapes.json"))
    p.add_argument("--max-m", type=int, default=128)
    p.add_argument("--controls", default="square-2048,square-8192,llama3-8b-o-m4096")
    p.add_argument("--only", default="")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--rep-ms", type=float, default=10.0)
    p.add_argument("--out", default="skinny_probe.json")
    p.add_argument("--space", default="default", choices=("default", "max"), help="the templates' config spaces")
    p.add_argument("--templates", default="skinny,gemv", help="which of skinny,gemv to tune")
    args = p.parse_args(argv)
    from gemmtune.offline.suite import load_suite

    specs = load_suite(args.suite)
    controls = set(filter(None, args.controls.split(",")))
    only = set(filter(None, args.only.split(",")))
    specs = [s for s in specs if (s.M <= args.max_m or s.name in controls) and (not only or s.name in only)]
    rows = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv)}
    for spec in specs:
        row = probe(spec, args.rounds, args.rep_ms, args.space, args.templates)
        rows.append(row)
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        cb_r, cb_w = row["cublas_ms_read"], row["cublas_ms_write"]
        parts = [f"{spec.name:28s} cublas r {cb_r:.4f} w {cb_w:.4f}"]
        for uid in ("triton_skinny", "triton_gemv"):
            if f"{uid}_ms_read" in row:
                parts.append(f"{uid[7:]} r {row[f'{uid}_ms_read']:.4f} ({cb_r / row[f'{uid}_ms_read']:.3f}x)"
                             f" w {row[f'{uid}_ms_write']:.4f} ({cb_w / row[f'{uid}_ms_write']:.3f}x)")
        if "skinny_host_us_fast" in row:
            parts.append(f"host fast {row['skinny_host_us_fast']:.1f} jit {row['skinny_host_us_jit']:.1f} "
                         f"cublas {row['cublas_host_us']:.1f} us; {row.get('triton_skinny_choice', '')}")
        if row.get("bad"):
            parts.append(f"BAD {len(row['bad'])}: {row['bad'][:3]}")
        print(" | ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
