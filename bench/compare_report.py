"""The report of `bench/compare.py`: its markdown table, the summary against the targets, and the plots.

    python bench/compare.py --merge a.json b.json --out compare.json --plot compare   # uses these
"""

from __future__ import annotations

import sys
from typing import Any


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [f"{meta.get('device')}, torch {meta.get('torch')}, triton {meta.get('triton')}, {meta.get('date')}", "",
           "| shape | problem | cuBLAS ms | gemmtune pick | ms | x cuBLAS | Inductor ms | x cuBLAS | "
           "tune s cold | warm | Inductor s | choices |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ind = r.get("inductor_ms")
        out.append(f"| {r['name']} | {r['problem']} | {r['cublas_ms']:.4f} | `{r['winner']}` | {r['gemmtune_ms']:.4f} | "
                   f"{r['speedup_vs_cublas']:.3f} | {'-' if ind is None else f'{ind:.4f}'} | "
                   f"{'-' if ind is None else format(r['inductor_speedup_vs_cublas'], '.3f')} | "
                   f"{r['gemmtune_cold_s']:.1f} | {r['gemmtune_warm_s']:.1f} | "
                   f"{'-' if r.get('inductor_tune_s') is None else format(r['inductor_tune_s'], '.1f')} | "
                   f"{r['n_choices']} |")
    ex = [r for r in rows if "exh_winner" in r]
    if ex:
        out += ["", "| shape | default pick | exhaustive pick | regret % | runs | exhaustive runs |", "|---|---|---|---|---|---|"]
        out += [f"| {r['name']} | `{r['winner']}` | `{r['exh_winner']}` | {r['regret_pct']:.2f} | "
                f"{r['benchmark_runs']} | {r['exh_runs']} |" for r in ex]
    return "\n".join(out)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, computed from the rows (None where the run did not measure it)."""
    import math
    import statistics

    def geomean(xs):
        xs = [x for x in xs if x]
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None

    out: dict[str, Any] = {"shapes": len(rows)}
    cold = [r["gemmtune_cold_s"] for r in rows]
    warm = [r["gemmtune_warm_s"] for r in rows]
    ind = [r["inductor_tune_s"] for r in rows if r.get("inductor_tune_s") is not None]
    out.update(median_cold_s=statistics.median(cold), median_warm_s=statistics.median(warm))
    if ind:
        out.update(median_inductor_s=statistics.median(ind),
                   cold_vs_inductor=statistics.median(cold) / statistics.median(ind),
                   warm_vs_inductor=statistics.median(warm) / statistics.median(ind))
    best = []
    for r in rows:
        ref = min(x for x in (r["cublas_ms"], r.get("inductor_ms"), r.get("exhaustive_ms")) if x is not None)
        best.append(r["gemmtune_ms"] / ref)
    out.update(within_1pct_of_best=sum(b <= 1.01 for b in best) / len(rows),
               worst_vs_best=max(best), worst_vs_cublas=max(r["gemmtune_ms"] / r["cublas_ms"] for r in rows),
               over_1_02_cublas=[r["name"] for r in rows if r["gemmtune_ms"] > 1.02 * r["cublas_ms"]],
               geomean_speedup=geomean([r["speedup_vs_cublas"] for r in rows]),
               inductor_geomean_speedup=geomean([r.get("inductor_speedup_vs_cublas") for r in rows]))
    for flush in ("write", "read"):
        other = [r.get(f"speedup_vs_cublas_{flush}") for r in rows]
        if any(other):
            out[f"geomean_speedup_{flush}_flush"] = geomean(other)
    for r in rows:
        if r.get("exh_best_template_ms"):
            out.setdefault("best_template_vs_library", {})[r["name"]] = r["exh_library_ms"] / r["exh_best_template_ms"]
    return out


def plot(rows: list[dict[str, Any]], prefix: str) -> list[str]:
    """Speedup over cuBLAS per shape and tuning time vs Inductor; [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot: matplotlib not installed, no plots", file=sys.stderr)
        return []
    names = [r["name"] for r in rows]
    x = range(len(rows))
    written = []
    for kind, series, ylabel in (
            ("speedup", [("gemmtune", "speedup_vs_cublas"), ("Inductor max-autotune", "inductor_speedup_vs_cublas")],
             "speedup over cuBLAS (x)"),
            ("tuning", [("gemmtune cold", "gemmtune_cold_s"), ("gemmtune warm", "gemmtune_warm_s"),
                        ("Inductor max-autotune", "inductor_tune_s")], "tuning wall time (s)")):
        fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.5), 4.5))
        width = 0.8 / len(series)
        for i, (label, key) in enumerate(series):
            ax.bar([j + i * width for j in x], [r.get(key) or 0.0 for r in rows], width, label=label)
        if kind == "speedup":
            ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in x])
        ax.set_xticklabels(names, rotation=70, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        ax.legend()
        fig.tight_layout()
        path = f"{prefix}_{kind}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
