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
- `gpu_pooled`: the GPU time with repeats pooled: a tiled Triton config's swizzles that give one tile
  order on the problem (`templates.base.tile_order`: every swizzle, with one row of tiles) run
  the same kernel, so their readings are repeats, and each reads their median.  The spread of those
  repeats (`repeats`: max - min over the median, per group) is the single readings' noise;

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
from gemmtune.offline.simulate import default_specs, load, repeat_groups, select_specs  # noqa: E402
from gemmtune.search import ProblemDims  # noqa: E402
from gemmtune.search.final import launch_key  # noqa: E402

STRATEGIES = ("exhaustive", "default", "prescreen[x=5,swizzle=4]")
READINGS = ("ms", "launch", "gpu", "gpu_pooled")


def readings(path: str) -> list[dict]:
    """Per shape record: choice key -> Measurement(ms, gpu_ms, host_ms) of every correct choice."""
    out = []
    for rec in read_lines(path):
        if rec.get("type") == "shape":
            out.append({choice_from(c).key: Measurement(c["ms"], c.get("gpu_ms"), c.get("host_ms"))
                        for c in rec["choices"] if c.get("ms") is not None and c.get("status", "ok") == "ok"})
    return out


def costs(shape, recorded: dict, m: int) -> dict[str, dict]:
    """choice key -> its cost by each reading (`ms`, `launch`, `gpu`, `gpu_pooled` over `m` rows)."""
    timings = [recorded[c.key].timing(c, "final") for c in shape.times]
    key = launch_key(timings)
    out = {t.choice.key: {"ms": t.ms, "launch": key(t)[0], "gpu": t.gpu_ms if t.gpu_ms is not None else t.ms}
           for t in timings}
    for group in repeat_groups(list(shape.times), m):
        pooled = statistics.median(out[c.key]["gpu"] for c in group)
        for c in group:
            out[c.key]["gpu_pooled"] = pooled
    return out


def repeat_spread(shape, recorded: dict, m: int) -> list[float]:
    """(max - min) / median of the GPU readings of each group of repeats with two or more readings."""
    spreads = []
    for group in repeat_groups(list(shape.times), m):
        gpu = [recorded[c.key].gpu_ms for c in group if recorded[c.key].gpu_ms is not None]
        if len(gpu) > 1:
            spreads.append((max(gpu) - min(gpu)) / statistics.median(gpu))
    return spreads


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
    print(f"{'strategy':28} {'GPU/host':8} {'runs %':>6}  {'vs best: ms':>14} {'launch':>14} {'gpu':>14} {'pooled':>14}"
          f"  {'vs exhaustive: ms':>17} {'launch':>14} {'gpu':>14} {'pooled':>14}")
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


def repeats_summary(spreads: dict[str, list[float]]) -> dict[str, dict]:
    """Per shape with repeats: how many groups, and the median and 90th percentile of their spreads
    (%); printed."""
    out = {}
    for name, got in spreads.items():
        if got:
            ranked = sorted(got)
            out[name] = {"groups": len(got), "median_pct": 100 * statistics.median(got),
                         "p90_pct": 100 * ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))]}
    if out:
        print("repeats (one kernel read at several swizzles): spread (max - min) / median, %")
        for name, r in out.items():
            print(f"  {name:44} {r['groups']:4d} groups  median {r['median_pct']:6.2f}  p90 {r['p90_pct']:6.2f}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    p.add_argument("--strategy", nargs="+", default=list(STRATEGIES))
    p.add_argument("--json", dest="json_path")
    args = p.parse_args(argv)
    shapes, dims = load(args.dataset)
    specs = select_specs(default_specs(shapes), args.strategy)
    rows, costs_of, spreads = [], {}, {}
    for shape, dim, recorded in zip(shapes, dims, readings(args.dataset)):
        cost = costs_of[shape.name] = costs(shape, recorded, dim.M)
        spreads[shape.name] = repeat_spread(shape, recorded, dim.M)
        best = {r: min(c[r] for c in cost.values()) for r in READINGS}
        for spec in specs:
            for handed in (False, True):
                key, timed = pick(shape, spec, dim, recorded, handed)
                rows.append({"shape": shape.name, "strategy": spec.name, "readings_handed_on": handed,
                             "pick": key, "runs_pct": 100 * timed / len(cost),
                             **{f"regret_{r}_pct": 100 * (cost[key][r] / best[r] - 1) for r in best}})
    if not rows:
        print(f"replay_readings: {args.dataset} has no shape with GPU and host readings to replay", file=sys.stderr)
        return 2
    against_exhaustive(rows, costs_of)
    print(f"{args.dataset}: {len(shapes)} shapes; max (median) regret %, by each reading: against the best "
          "choice, and against the exhaustive strategy's pick (same final, same readings)")
    summary = summarize(rows, [spec.name for spec in specs])
    repeats = repeats_summary(spreads)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"dataset": args.dataset, "summary": summary, "repeats": repeats,
                                                    "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
