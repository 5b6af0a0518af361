"""Where a model's cold warm-up goes: a timeline of `gemmtune.warmup` per problem and phase.

Each case runs in a fresh Python process with fresh Triton, Inductor and gemmtune caches (what a
user's first run pays): import time, then `gemmtune.warmup` of a bench/models.py model with gemmtune's
log at INFO, each line stamped with seconds since the warm-up began, then per problem the
Selection's facts (compile wall time, the sum of the binaries' compile times, prescreen and final
time, benchmark runs, binaries built).  A case is `M` or `M:isolation` (isolation "off" or "subprocess"),
with flags appended:
- `+ptxas`: compile with torch's own ptxas (`TRITON_PTXAS_PATH`, as Inductor sets it once it has
  compiled anything in the process);
- `+inductor`: compile the model with Inductor max-autotune first in the same process, then new
  caches: Inductor's compile-and-autotune and gemmtune's first run side by side in one process;
- `+fed`: instead of `gemmtune.warmup`, Inductor max-autotune fed by gemmtune
  (`gemmtune.inductor.installed()`): its compile, tuning and first forward;
- `+cprofile`: the warm-up under cProfile, its top entries by cumulative time printed and kept;
- `+warm`: reuse the gemmtune store of the case before with the same M (a new machine that shares
  the store: every other cache new);
- `+host`: with `+warm`, also keep that case's Triton, Inductor and gemmtune cache folders (a second
  program start on the same machine: Triton's binaries and its kept installation key are there).

    python bench/warmup_profile.py --cases 1,128,128:off,128+ptxas --out warmup_profile.json
    python bench/warmup_profile.py --cases 16+inductor+fed,16+fed+warm --out fed_first_run.json

Prints each case's timeline and a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOST_CACHES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "GEMMTUNE_CACHE_DIR")  # what `+host` keeps


def child(m: int, model: str, isolation: str | None, flags: set[str]) -> dict:
    """One case in this (fresh) process: the timeline and facts as a dict."""
    t_import = time.perf_counter()
    if isolation:
        os.environ["GEMMTUNE_ISOLATION"] = isolation
    sys.path.insert(0, str(HERE))
    import models  # noqa: E402  (fresh cache directories, then torch and gemmtune)

    def caches(tag: str) -> None:
        models.fresh_caches(tag)
        if os.environ.get("PROFILE_STORE"):  # the store a `+warm` case shares with the case before it
            os.environ["GEMMTUNE_STORE"] = os.environ["PROFILE_STORE"]
        if "host" in flags and os.environ.get("PROFILE_HOST"):  # that case's cache folders too
            os.environ.update(json.loads(os.environ["PROFILE_HOST"]))

    caches("case")
    imported = time.perf_counter() - t_import
    net, inputs = models.build(model, m)
    torch = models.torch
    out: dict = {"M": m, "model": model, "isolation": isolation or "auto", "flags": sorted(flags), "import_s": imported}
    if "inductor" in flags:
        import copy

        t1 = time.perf_counter()
        with torch.no_grad():
            torch.compile(copy.deepcopy(net), mode="max-autotune-no-cudagraphs")(*inputs)
        torch.cuda.synchronize()
        out["inductor_first_s"] = time.perf_counter() - t1
        torch._dynamo.reset()  # the next compile of an equal model must not reuse this program
        caches("after-inductor")
    torch.cuda.synchronize()
    before = set(sys.modules)
    t0 = time.perf_counter()
    prof = _profiler() if "cprofile" in flags else None
    with models.Stamped() as stamped:
        if prof is not None:
            prof.enable()
        out.update(fed(torch, net, inputs) if "fed" in flags else warmed(models, net, inputs))
        if prof is not None:
            prof.disable()
            out["cprofile"] = _top(prof)
    out["cache_dirs"] = {v: os.environ[v] for v in HOST_CACHES}
    out["imports"] = imported_since(before)
    out.update(warmup_s=time.perf_counter() - t0, ptxas=os.environ.get("TRITON_PTXAS_PATH"),
               facts=models.selection_facts(), timeline=stamped.lines)
    return out


def imported_since(before: set[str]) -> dict[str, list[int]]:
    """Modules the warm-up imported, by top-level package: [imported, of which from source (no
    bytecode cached beside it: compiled in this process)]."""
    import importlib.util

    out: dict[str, list[int]] = {}
    for name in sorted(set(sys.modules) - before):
        origin = getattr(getattr(sys.modules[name], "__spec__", None), "origin", None) or ""
        row = out.setdefault(name.split(".")[0], [0, 0])
        row[0] += 1
        if origin.endswith(".py"):
            try:
                row[1] += not Path(importlib.util.cache_from_source(origin)).exists()
            except (ValueError, NotImplementedError):
                pass
    return out


def _profiler():  # type: ignore[no-untyped-def]
    import cProfile

    return cProfile.Profile()


def _top(prof, lines: int = 45) -> str:  # type: ignore[no-untyped-def]
    """The profile's top entries by cumulative time, as pstats prints them."""
    import io
    import pstats

    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).sort_stats("cumulative")
    stats.print_stats(lines)
    stats.sort_stats("tottime").print_stats(25)  # and where the time is spent itself
    stats.sort_stats("cumulative").print_stats("triton", 30)  # and Triton's part (first compile, loading)
    stats.print_callers("_hashlib|builtins.compile")  # who hashes and who compiles Python source
    return buf.getvalue()


def warmed(models, net, inputs) -> dict:  # type: ignore[no-untyped-def]
    report = models.gemmtune.warmup(net, *inputs, progress=False)
    return {"check_s": report.check_s, "rows": [(r.problem, r.winner, r.seconds) for r in report.rows]}


def fed(torch, net, inputs) -> dict:  # type: ignore[no-untyped-def]
    """Inductor max-autotune fed by gemmtune (`gemmtune.inductor.installed()`): compile and first forward."""
    import gemmtune.inductor as gi

    with gi.installed() as handler, gi.benchmark_probe() as counted, torch.no_grad():
        torch.compile(net, mode="max-autotune-no-cudagraphs")(*inputs)
        torch.cuda.synchronize()
    return {"check_s": 0.0, "rows": [], "fed_stats": dict(handler.stats), "benchmarked": counted.choices}


def print_case(case: str, res: dict, wall: float) -> None:
    """One case's summary line, its imports, timeline, profile and per-problem table."""
    print(f"\n== case {case}: import {res['import_s']:.2f} s, gemmtune {res['warmup_s']:.2f} s "
          f"(check {res['check_s']:.2f} s), process {wall:.1f} s, Inductor first {res.get('inductor_first_s')}, "
          f"ptxas {res['ptxas']}" + (f", fed: {res['fed_stats']}, Inductor benchmarked {res['benchmarked']}"
                                     if "fed_stats" in res else ""))
    print("  imported during the warm-up (package: modules, of them from source): "
          + ", ".join(f"{k}: {v[0]}/{v[1]}" for k, v in sorted(res.get("imports", {}).items(), key=lambda kv: -kv[1][0])))
    for t, msg in res["timeline"]:
        print(f"  {t:8.3f}  {msg}")
    if "cprofile" in res:
        print(res["cprofile"])
    print("  | problem | winner | tune s | compile s | binaries | sum of binaries s | prescreen s | final s | runs |")
    for f in res["facts"]:
        print(f"  | {f['problem']} | {f['winner']} | {f['tuning_s']:.2f} | {f['compile_s']:.2f} | {f['binaries']} | "
              f"{f['binary_sum_s']:.2f} | {f['prescreen_s']:.2f} | {f['final_s']:.2f} | {f['runs']} |")


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
        print(json.dumps(child(int(m), args.model, iso or None, set(flags))))
        return 0
    results: list[dict] = []
    stores: dict[str, str] = {}  # M -> the store of its last case (a `+warm` case reuses it)
    hosts: dict[str, dict] = {}  # M -> the cache folders of its last case (a `+warm+host` case reuses them)
    scratch = Path(tempfile.mkdtemp(prefix="gemmtune-profile-"))
    for i, case in enumerate(args.cases.split(",")):
        t0 = time.perf_counter()
        env = dict(os.environ)
        m = case.split("+")[0].split(":")[0]
        if "+warm" not in case or m not in stores:
            stores[m] = str(scratch / f"store-{i}.db")
        env["PROFILE_STORE"] = stores[m]
        if "+host" in case and m in hosts:
            env["PROFILE_HOST"] = json.dumps(hosts[m])
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
        hosts[m] = res.get("cache_dirs", {})
        results.append(res)
        print_case(case, res, wall)
        Path(args.out).write_text(json.dumps({"meta": {"date": time.strftime("%Y-%m-%d"),
                                                       "command": " ".join(sys.argv)}, "cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
