"""The eager target's reading pooled over several `steady-eager` runs: every round's time of a variant
over the mean of the three plain copies' (`eager`, `eager_copy`, `eager_late`) in that round, the median
over all rounds of all runs, and a bootstrap 95 % interval of that median.

    python bench/steady_eager_pooled.py bench/results/steady_eager_release_h100_2026-12-05.json \\
        bench/results/steady_eager_release_run2_h100_2026-12-05.json --out pooled.json

Each file is `bench/models.py` output (`python bench/gpu_run.py steady-eager`); the rounds of one run are
paired within that run only, so runs on different machines pool without mixing their levels.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from linear_forward_cost import paired  # noqa: E402

PLAIN = ("eager", "eager_copy", "eager_late")
VARIANTS = ("eager_warmup", "eager_warmup_patched", "eager_copy", "eager_late", "eager_closure",
            "eager_subclass", "eager_lean")


def rounds_of(path: Path) -> dict[str, dict[str, list[float]]]:
    """{case: {variant: round_ms}} of one run."""
    data = json.loads(path.read_text())
    return {c["case"]: {s["variant"]: s["round_ms"] for s in c["steady"]} for c in data["cases"]}


def pooled(paths: list[Path]) -> dict[str, dict[str, dict[str, float]]]:
    """{case: {variant: {x_eager, lo, hi, rounds, runs}}} over the runs in `paths` (a variant counts in
    the runs that timed it; a run without the three plain copies is skipped)."""
    runs = [rounds_of(p) for p in paths]
    table: dict[str, dict[str, dict[str, float]]] = {}
    for case in sorted({case for run in runs for case in run}):
        for variant in VARIANTS:
            ms, ref, used = [], [], 0
            for run in runs:
                rounds = run.get(case, {})
                if variant not in rounds or not all(p in rounds for p in PLAIN):
                    continue
                ms += rounds[variant]
                ref += [sum(r) / len(PLAIN) for r in zip(*(rounds[p] for p in PLAIN))]
                used += 1
            if ms:
                table.setdefault(case, {})[variant] = dict(paired(ms, ref), rounds=len(ms), runs=used)
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="steady-eager runs (bench/models.py JSON)")
    p.add_argument("--out", type=Path, help="write the table as JSON here")
    args = p.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"steady_eager_pooled: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    table = pooled(args.files)
    print("| case | variant | x plain eager (95 % interval) | rounds | runs |\n|---|---|---|---|---|")
    for case, rows in table.items():
        for variant, r in rows.items():
            print(f"| {case} | {variant} | {r['x_eager']:.4f} ({r['lo']:.4f}-{r['hi']:.4f}) | {r['rounds']} "
                  f"| {r['runs']} |")
    if args.out:
        args.out.write_text(json.dumps({"files": [f.name for f in args.files], "cases": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
