"""How a simulation is shown: a rich table and a regret-vs-work plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Sequence

    from matplotlib.figure import Figure
    from rich.table import Table

    from .simulate_results import SimulationReport, StrategyResult


_MARKERS = {"exhaustive": "s", "prescreen": "o", "model_pruned": "^", "budgeted": "D", "default": "*"}


def _pct(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "inf"


def headline(report: "SimulationReport") -> list["StrategyResult"]:
    """The strategies that matter, in the report's order: exhaustive (the yardstick), default (what tune
    runs) and each other family's best (`prescreen[...]` is the family prescreen): least max regret,
    then least median regret, then least work.

    Example:
        >>> from gemmtune.offline.simulate_results import ShapeResult, StrategyResult, SimulationReport
        >>> r = lambda name, regret, runs: StrategyResult(name, (ShapeResult((8, 8, 8), "s", "a", regret, runs, 10, 0, 0.0),))
        >>> rep = SimulationReport((r("exhaustive", 0.0, 10), r("p[x=1]", 2.0, 2), r("p[x=2]", 0.0, 3), r("p[x=3]", 0.0, 4),
        ...                         r("default", 0.0, 3)))
        >>> [s.name for s in headline(rep)]
        ['exhaustive', 'p[x=2]', 'default']
    """
    best: dict[str, "StrategyResult"] = {}
    for s in report.strategies:
        family = s.name.split("[")[0]
        if s.name in ("exhaustive", "default"):
            best[s.name] = s
        elif family not in best or _rank(s) < _rank(best[family]):
            best[family] = s
    return [s for s in report.strategies if s in best.values()]


def _rank(s: "StrategyResult") -> tuple[float, float, float]:
    return s.max_regret_pct, s.median_regret_pct, s.work_fraction


def source_line(meta: dict, where: str) -> str:
    """Where a simulation's timings come from: the device and date its dataset's meta line records.

    Example:
        >>> source_line({"env": {"device": "NVIDIA H200"}, "date": "2026-11-30T10:03:21+00:00"}, "h200.jsonl.gz")
        'timings recorded on an NVIDIA H200 on 2026-11-30 (h200.jsonl.gz)'
    """
    device = str((meta.get("env") or {}).get("device") or "")
    date = str(meta.get("date") or "")[:10]
    article = "an" if device[:1].upper() in "AEIOU" or device.startswith("NVIDIA") else "a"
    on = f"on {article} {device}" if device else "on a device the dataset does not name"
    return f"timings recorded {on}{f' on {date}' if date else ''} ({where})"


def render_table(report: "SimulationReport", title: str = "gemmtune simulate",
                 strategies: "Sequence[StrategyResult] | None" = None) -> "Table":
    """One row per strategy (of `strategies`, default every one): regret (max, median), work, compiles,
    estimated tuning time.  The numbers never wrap: at 80 columns the strategy names fold.

    Example:
        >>> import io
        >>> from rich.console import Console
        >>> from gemmtune.offline.simulate import simulate, StrategySpec
        >>> from gemmtune.offline.dataset import ReplayShape
        >>> from gemmtune.core.choices import Choice
        >>> rep = simulate([ReplayShape((8, 8, 8), {Choice("a", None): 1.0})], [StrategySpec("exhaustive", "exhaustive")])
        >>> console = Console(width=120, record=True, file=io.StringIO())
        >>> console.print(render_table(rep)); "exhaustive" in console.export_text()
        True
    """
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    table.add_column("strategy", overflow="fold")
    for col in ("max\nregret %", "median\nregret %", "work\nfraction", "runs", "compiles", "est.\ntuning s"):
        table.add_column(col, justify="right", no_wrap=True)
    for s in report.strategies if strategies is None else strategies:
        table.add_row(Text(s.name), _pct(s.max_regret_pct), _pct(s.median_regret_pct), f"{s.work_fraction:.3f}",
                      str(s.benchmark_runs), str(s.compiles), f"{s.est_tuning_s:.1f}")
    return table


def plot_regret_vs_work(report: "SimulationReport", path: str | Path) -> Path:
    """Write a scatter plot: x = work fraction, y = max regret %, one labelled marker per strategy.

    Uses matplotlib's Agg canvas (no display needed); raises RuntimeError if matplotlib is missing.

    Example:
        plot_regret_vs_work(simulate(shapes, default_specs(shapes)), "regret.png")
    """
    fig = regret_figure(report)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    return path


def regret_figure(report: "SimulationReport") -> "Figure":
    """The matplotlib Figure `plot_regret_vs_work` writes: regret on a symlog axis from 0 up (a regret is
    never negative, and no axis below 0 is drawn); an infinite regret (nothing correct timed) at the top.

    Example:
        regret_figure(simulate(shapes, default_specs(shapes))).axes[0].get_ylim()[0]  # 0.0
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError("plotting needs matplotlib: pip install 'gemmtune[plot]'") from exc

    fig = Figure(figsize=(13, 7))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    finite = [s.max_regret_pct for s in report.strategies if math.isfinite(s.max_regret_pct)]
    top = max(finite, default=1.0) * 1.1 or 1.0
    spots: dict[tuple[float, float], list[str]] = {}  # strategies on the same spot share one label
    for i, s in enumerate(report.strategies, 1):
        y = max(0.0, s.max_regret_pct) if math.isfinite(s.max_regret_pct) else top
        family = s.name.split("[")[0]
        marker = _MARKERS.get(family, "x")
        ax.scatter(s.work_fraction, y, marker=marker, s=110 if family == "default" else 45, label=f"{i}  {s.name}")
        spots.setdefault((round(s.work_fraction, 3), round(y, 2)), []).append(str(i))
    for n, ((x, y), ids) in enumerate(sorted(spots.items())):
        ax.annotate(",".join(ids), (x, y), fontsize=7, xytext=(4, 4 + 9 * (n % 3)), textcoords="offset points")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, ncol=1 + len(report.strategies) // 36,
              frameon=False)
    ax.set_xlabel("work fraction (benchmark runs / exhaustive runs)")
    ax.set_ylabel("max regret % vs exhaustive best")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylim(bottom=0.0)  # regret is never negative: no axis below 0
    ax.set_xlim(0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.set_title("search strategies on recorded timings: regret vs work")
    fig.tight_layout()
    return fig
