"""Whole models under torch.compile and eager, by one protocol: first calls in fresh processes, then the
steady state of every variant in shuffled, interleaved rounds in one process, as paired ratios.

Per case `MODEL:M` (models and variants: bench/model_runs.py), each `--first` variant runs in a fresh
process on new caches, or on those an earlier process of its group left: the seconds to the end of the
first forward, what Inductor benchmarked, gemmtune's handler counts.  Then one process sets every
`--steady` variant up from those caches and times them in `--rounds` shuffled rounds of `--iters` calls:
a ratio is the median of per-round ratios (to max-autotune-no-cudagraphs, an eager variant's also to
plain eager), so drift that hits a round hits every variant.  Writes JSON after every process.

    python bench/models.py --cases stack:1,stack:512,llama:64 --train --out models.json
    python bench/models.py --cases stack:1 --first '' --steady eager,eager_copy,eager_late --copies 4  # A/A controls
    python bench/models.py --cases tiny:8 --first default,gemmtune --steady default,gemmtune --rounds 3
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
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import model_runs  # noqa: E402
from model_runs import FIRST, FIRST_DEFAULT, STEADY, torch  # noqa: E402


def spawn(args: list[str], env: dict[str, str], timeout: float, script: str = "model_runs.py") -> Any:
    """`python bench/SCRIPT ARGS` with `env` over this environment: its last JSON line, or an error."""
    path = os.pathsep.join(p for p in (str(HERE.parent / "src"), os.environ.get("PYTHONPATH")) if p)
    full = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    try:
        done = subprocess.run([sys.executable, str(HERE / script), *args], env=full, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    sys.stderr.write(done.stderr[-3000:])
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(("{", "["))]
    if done.returncode or not lines:
        return {"error": f"rc {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ''}"}
    return json.loads(lines[-1])


def run_case(case: str, first: list[str], steady: list[str], root: Path, opts: Any, write: Callable) -> dict:
    """One case: its first calls, each in its own process, then the steady state of the forward variants
    and of the training steps, each in a process of its own (a training compile cut short loses nothing)."""
    model, m = case.split(":")
    out: dict[str, Any] = {"case": case, "first": [], "steady": []}
    for variant in first:
        rec = spawn(["first", model, m, variant], model_runs.cache_env(root / case, *FIRST[variant]), timeout=300)
        rec.setdefault("variant", variant)
        out["first"].append(rec)
        print(json.dumps(rec), flush=True)
        write(out)
    for variants, train in ((steady, False), ([], opts.train)):
        if variants or train:
            rows = spawn(["steady", model, m, ",".join(variants), str(root / case), "--rounds", str(opts.rounds),
                          "--iters", str(opts.iters), "--copies", str(opts.copies), *(["--train"] if train else [])],
                         {}, timeout=420)
            out["steady"] += rows if isinstance(rows, list) else [rows]
            write(out)
    return out


def print_tables(cases: list[dict], meta: dict) -> None:
    """The first calls (s, Inductor's benchmarks) and the steady state (ms, paired ratios) as Markdown."""
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']}")
    print("| case | variant | first call s | Inductor benchmarks | gemmtune handler |\n|---|---|---|---|---|")
    for c in cases:
        for r in c["first"]:
            cell = r.get("error") or f"{r['first_s']:.1f}"
            print(f"| {c['case']} | {r['variant']} | {cell} | {r.get('benchmarked', '-')} | {r.get('handler', '-')} |")
    print("\n| case | variant | ms per call | x max-autotune | q1-q3 | x eager (q1-q3) | rel. err |")
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--cases", default="stack:1,stack:512,llama:64", help="MODEL:M, comma-separated")
    p.add_argument("--first", default=",".join(FIRST_DEFAULT), help="first-call variants ('' for none)")
    p.add_argument("--steady", default=",".join(STEADY), help="steady-state variants ('' for none)")
    p.add_argument("--train", action="store_true", help="also a training step (forward + backward) per call")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--iters", type=int, default=10, help="calls per variant per round")
    p.add_argument("--copies", type=int, default=1, help="each eager variant on this many copies, called in turn")
    p.add_argument("--root", default="", help="the caches' folder (default: new; with --first '', an earlier run's)")
    p.add_argument("--out", default="models.json")
    args = p.parse_args(argv)
    args.first, args.steady = ([v for v in text.split(",") if v] for text in (args.first, args.steady))
    known = {*FIRST, *model_runs.CONTROLS, *model_runs.STEADY_GROUP}
    if unknown := [v for v in args.first if v not in FIRST] + [v for v in args.steady if v not in known]:
        p.error(f"unknown variant(s) {', '.join(unknown)}: first {', '.join(FIRST)}; steady also "
                f"{', '.join(known - set(FIRST))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="gemmtune-models-"))
    meta = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
            "rounds": args.rounds, "iters": args.iters, "copies": args.copies}
    cases: list[dict] = []

    def write(case: dict) -> None:  # after every process, so a run cut short keeps what it measured
        Path(args.out).write_text(json.dumps({"meta": meta, "cases": [*cases, case]}, indent=1, default=str))

    for case in args.cases.split(","):
        cases.append(run_case(case, args.first, args.steady, root, args, write))
    Path(args.out).write_text(json.dumps({"meta": meta, "cases": cases}, indent=1, default=str))
    print_tables(cases, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
