"""Replay a sweep with its recorded GPU and host times handed to tune's final, and read the regret three ways.

`gemmtune simulate` replays a dataset with each choice's recorded cost (`ms`: max(GPU, host) where the
sweep counted the host) standing in for the device; the GPU and host times the sweep also records are
not handed on, so the final's rules that read them (`gemmtune.search.final`: the launch tie, the
GPU-time guard for the library kernel, the launch-aware check) are idle. This script hands them on and
reports, per strategy, the regret of the final's pick measured against the exhaustive best by:

- `ms`: the recorded cost (what `gemmtune simulate` reports);
- `launch`: the cost with each host time within the noise of its template's median taken as that
  median (`launch_key`, what the final ranks by);
- `gpu`: the GPU time alone (what `bench/compare.py` compares);

and, for each strategy, its pick's regret against the exhaustive strategy's pick under the same final
and the same readings (`vs_exhaustive_*`: what timing fewer choices loses), beside the share of
choices it timed (`runs_pct`, the mean over shapes of timed / correct choices).

    python bench/replay_readings.py bench/results/fp8_sweep_m16_h200_2026-12-02.jsonl.gz --json out.json

CPU only; prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from gemmtune.measure.measurement import Measurement  # noqa: E402
from gemmtune.offline.dataset import choice_from, read_lines  # noqa: E402
from gemmtune.offline.replay import decide  # noqa: E402
from gemmtune.offline.simulate import default_specs, load, select_specs  # noqa: E402
from gemmtune.search import ProblemDims  # noqa: E402
from gemmtune.search.final import launch_key  # noqa: E402

STRATEGIES = ("exhaustive", "default", "prescreen[x=5,swizzle=4]")
READINGS = ("ms", "launch", "gpu")


def readings(path: str) -> list[dict]:
    """Per shape record: choice key -> Measurement(ms, gpu_ms, host_ms) of every correct choice."""
    out = []
    for rec in read_lines(path):
        if rec.get("type") == "shape":
            out.append({choice_from(c).key: Measurement(c["ms"], c.get("gpu_ms"), c.get("host_ms"))
                        for c in rec["choices"] if c.get("ms") is not None and c.get("status", "ok") == "ok"})
    return out


def costs(shape, recorded: dict) -> dict[str, dict]:
    """choice key -> its cost by each reading (`ms`, `launch`, `gpu`)."""
    timings = [recorded[c.key].timing(c, "final") for c in shape.times]
    key = launch_key(timings)
    return {t.choice.key: {"ms": t.ms, "launch": key(t)[0], "gpu": t.gpu_ms if t.gpu_ms is not None else t.ms}
            for t in timings}


def pick(shape, spec, dims: ProblemDims, recorded: dict, with_readings: bool) -> tuple[str, int]:
    """The final's pick under `spec`, the recorded readings handed on (or only the recorded cost), and
    how many choices it timed."""
    answers = recorded if with_readings else {k: Measurement(m.cost_ms) for k, m in recorded.items()}
    d = decide(shape, spec.registered, spec.options_for(shape, dims), spec.final, spec.runs_for(shape), answers)
    return d.pick.key, len(d.timed)


def against_exhaustive(rows: list[dict], costs_of: dict[str, dict]) -> None:
    """Add to each row its pick's regret against the exhaustive strategy's pick under the same final
    and readings (`vs_exhaustive_{reading}_pct`): what the strategy loses by timing fewer choices."""
    exhaustive = {(r["shape"], r["readings_handed_on"]): r["pick"] for r in rows if r["strategy"] == "exhaustive"}
    for r in rows:
        ref = exhaustive.get((r["shape"], r["readings_handed_on"]))
        if ref is None:
            continue
        cost = costs_of[r["shape"]]
        r.update({f"vs_exhaustive_{k}_pct": 100 * (cost[r["pick"]][k] / cost[ref][k] - 1) for k in READINGS})


def _cells(mine: list[dict], prefix: str) -> dict[str, tuple[float, float]]:
    got = {r: [x[f"{prefix}{r}_pct"] for x in mine if f"{prefix}{r}_pct" in x] for r in READINGS}
    return {r: (max(v), statistics.median(v)) for r, v in got.items() if v}


def summarize(rows: list[dict], names: list[str]) -> list[dict]:
    """Per strategy and handed-on flag: max and median regret by each reading, against the best and
    against exhaustive's pick, and the share of choices timed (`runs_pct`, over every shape); printed."""
    print(f"{'strategy':28} {'GPU/host':8} {'runs %':>6}  {'vs best: ms':>14} {'launch':>14} {'gpu':>14}"
          f"  {'vs exhaustive: ms':>17} {'launch':>14} {'gpu':>14}")
    summary = []
    for name in names:
        for handed in (False, True):
            mine = [r for r in rows if r["strategy"] == name and r["readings_handed_on"] == handed]
            best, exh = _cells(mine, "regret_"), _cells(mine, "vs_exhaustive_")
            runs = statistics.fmean(r["runs_pct"] for r in mine)
            summary.append({"strategy": name, "readings_handed_on": handed, "runs_pct": runs,
                            **{f"{r}_max_pct": v[0] for r, v in best.items()},
                            **{f"{r}_median_pct": v[1] for r, v in best.items()},
                            **{f"vs_exhaustive_{r}_max_pct": v[0] for r, v in exh.items()},
                            **{f"vs_exhaustive_{r}_median_pct": v[1] for r, v in exh.items()}})
            print(f"{name:28} {'yes' if handed else 'no':8} {runs:6.1f}  "
                  + " ".join(f"{v[0]:7.2f} ({v[1]:4.2f})" for v in best.values()) + "     "
                  + " ".join(f"{v[0]:7.2f} ({v[1]:4.2f})" for v in exh.values()))
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    p.add_argument("--strategy", nargs="+", default=list(STRATEGIES))
    p.add_argument("--json", dest="json_path")
    args = p.parse_args(argv)
    shapes, dims = load(args.dataset)
    specs = select_specs(default_specs(shapes), args.strategy)
    rows, costs_of = [], {}
    for shape, dim, recorded in zip(shapes, dims, readings(args.dataset)):
        cost = costs_of[shape.name] = costs(shape, recorded)
        best = {r: min(c[r] for c in cost.values()) for r in READINGS}
        for spec in specs:
            for handed in (False, True):
                key, timed = pick(shape, spec, dim, recorded, handed)
                rows.append({"shape": shape.name, "strategy": spec.name, "readings_handed_on": handed,
                             "pick": key, "runs_pct": 100 * timed / len(cost),
                             **{f"regret_{r}_pct": 100 * (cost[key][r] / best[r] - 1) for r in best}})
    against_exhaustive(rows, costs_of)
    print(f"{args.dataset}: {len(shapes)} shapes; max (median) regret %, by each reading: against the best "
          "choice, and against the exhaustive strategy's pick (same final, same readings)")
    summary = summarize(rows, [spec.name for spec in specs])
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"dataset": args.dataset, "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
