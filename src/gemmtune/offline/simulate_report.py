"""How a simulation is shown: a rich table and a regret-vs-work plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

    from .simulate_results import SimulationReport


_MARKERS = {"exhaustive": "s", "prescreen": "o", "model_pruned": "^", "budgeted": "D", "default": "*"}


def _pct(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "inf"


def render_table(report: "SimulationReport", title: str = "gemmtune simulate") -> "Table":
    """One row per strategy: regret (max, median), work, compiles, estimated tuning time.

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
    for col in ("strategy", "max regret %", "median regret %", "work fraction", "runs", "compiles", "est. tuning s"):
        table.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for s in report.strategies:
        table.add_row(Text(s.name), _pct(s.max_regret_pct), _pct(s.median_regret_pct), f"{s.work_fraction:.3f}",
                      str(s.benchmark_runs), str(s.compiles), f"{s.est_tuning_s:.1f}")
    return table


def plot_regret_vs_work(report: "SimulationReport", path: str | Path) -> Path:
    """Write a scatter plot: x = work fraction, y = max regret %, one labelled marker per strategy.

    Uses matplotlib's Agg canvas (no display needed); raises RuntimeError if matplotlib is missing.

    Example:
        plot_regret_vs_work(simulate(shapes, default_specs(shapes)), "regret.png")
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
        y = s.max_regret_pct if math.isfinite(s.max_regret_pct) else top
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
    ax.set_xlim(0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.set_title("search strategies on recorded timings: regret vs work")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    return path
