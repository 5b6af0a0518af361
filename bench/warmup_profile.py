"""Where a model's cold warm-up goes: a timeline of `gemmtune.warmup` per problem and phase.

Each case runs in a fresh Python process with fresh Triton, Inductor and gemmtune caches (what a
user's first run pays): import time, then `gemmtune.warmup` of a bench/models.py model with gemmtune's
log at INFO, each line stamped with seconds since the warm-up began, then per problem the
Selection's facts (compile wall time, the sum of the binaries' compile times, prescreen and final
time, benchmark runs, binaries built).  A case is `M` or `M:isolation` (isolation "off" or "subprocess"),
with `+ptxas` appended to compile with torch's own ptxas (`TRITON_PTXAS_PATH`, as Inductor sets it once
it has compiled anything in the process), and `+inductor` to compile the model with Inductor
max-autotune first in the same process (what bench/models.py does before its gemmtune variant).

    python bench/warmup_profile.py --cases 1,128,128:off,128+ptxas --out warmup_profile.json

Prints each case's timeline and a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(m: int, model: str, isolation: str | None, inductor_first: bool = False) -> dict:
    """One case in this (fresh) process: the timeline and facts as a dict."""
    t_import = time.perf_counter()
    if isolation:
        os.environ["GEMMTUNE_ISOLATION"] = isolation
    sys.path.insert(0, str(HERE))
    import models  # noqa: E402  (fresh cache directories, then torch and gemmtune)

    imported = time.perf_counter() - t_import
    net, inputs = models.build(model, m)
    torch = models.torch
    inductor_s = None
    if inductor_first:
        import copy

        t1 = time.perf_counter()
        with torch.no_grad():
            torch.compile(copy.deepcopy(net), mode="max-autotune-no-cudagraphs")(*inputs)
        torch.cuda.synchronize()
        inductor_s = time.perf_counter() - t1
        models.fresh_caches("after-inductor")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with models.Stamped() as stamped:
        report = models.gemmtune.warmup(net, *inputs, progress=False)
    total = time.perf_counter() - t0
    facts, lines = models.selection_facts(), stamped.lines
    return {"M": m, "model": model, "isolation": isolation or "auto", "import_s": imported, "warmup_s": total,
            "inductor_first_s": inductor_s, "ptxas": os.environ.get("TRITON_PTXAS_PATH"),
            "check_s": report.check_s, "rows": [(r.problem, r.winner, r.seconds) for r in report.rows],
            "facts": facts, "timeline": lines}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="1,128")
    p.add_argument("--model", default="stack")
    p.add_argument("--out", default="warmup_profile.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        case, *flags = args.child.split("+")
        m, _, iso = case.partition(":")
        print(json.dumps(child(int(m), args.model, iso or None, "inductor" in flags)))
        return 0
    results = []
    for case in args.cases.split(","):
        t0 = time.perf_counter()
        env = dict(os.environ)
        if "+ptxas" in case:
            import torch  # only to find its directory

            ptxas = Path(torch.__file__).parent / "bin" / "ptxas"
            if not ptxas.is_file():
                print(f"case {case}: torch has no {ptxas}; skipped")
                continue
            env["TRITON_PTXAS_PATH"] = str(ptxas)
        proc = subprocess.run([sys.executable, __file__, "--child", case, "--model", args.model],
                              capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(f"case {case}: exit {proc.returncode}\n{proc.stderr[-3000:]}", file=sys.stderr)
            results.append({"case": case, "error": proc.stderr[-2000:]})
            continue
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        res["process_wall_s"] = wall
        results.append(res)
        print(f"\n== case {case}: import {res['import_s']:.2f} s, warm-up {res['warmup_s']:.2f} s "
              f"(check {res['check_s']:.2f} s), process {wall:.1f} s, Inductor first {res['inductor_first_s']}, "
              f"ptxas {res['ptxas']}")
        for t, msg in res["timeline"]:
            print(f"  {t:8.3f}  {msg}")
        print("  | problem | winner | tune s | compile s | binaries | sum of binaries s | prescreen s | final s | runs |")
        for f in res["facts"]:
            print(f"  | {f['problem']} | {f['winner']} | {f['tuning_s']:.2f} | {f['compile_s']:.2f} | {f['binaries']} | "
                  f"{f['binary_sum_s']:.2f} | {f['prescreen_s']:.2f} | {f['final_s']:.2f} | {f['runs']} |")
        Path(args.out).write_text(json.dumps({"meta": {"date": time.strftime("%Y-%m-%d"),
                                                       "command": " ".join(sys.argv)}, "cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
