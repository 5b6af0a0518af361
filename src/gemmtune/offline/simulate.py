"""`gemmtune simulate`: replay search strategies on recorded timings and weigh regret against work.

Each strategy runs on each recorded shape with `measure` answered from the recording, followed
by tune's final step (`gemmtune.search.final`), both through `replay.decide`.  Per strategy:
regret of the final pick against the exhaustive best (from the recorded times), benchmark runs,
binaries compiled (only binaries whose choices were timed: a model-pruned or budget-stopped
search compiles less) and an estimated tuning time (compiles, then each timed choice as the GPU
timer runs it; the final's interleaved re-time is not counted).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from ..core.choices import Choice
from ..core.inputs import OPS, parse_dtype
from ..measure.timers import planned_runs
from ..pipeline.plan import default_options, template_stage1
from ..search import ALIASES, STRATEGIES, Options, PrescreenOptions, ProblemDims, for_device
from ..search.final import FinalRule
from ..templates.base import kernel_key
from .dataset import ReplayShape, load_dataset, read_lines
from .replay import decide
from .simulate_report import headline, plot_regret_vs_work, render_table, source_line
from .simulate_results import ShapeResult, SimulationReport, StrategyResult

SHIPPED = "data/h200_suite.jsonl.gz"


@dataclass(frozen=True)
class StrategySpec:
    """One strategy to simulate: a registered name or an alias (`gemmtune.search.ALIASES`: "default" is
    the default effort's strategy, "budgeted" runs `inner`), its options (the registered strategy's own
    options type; None: its defaults), and optionally a budget as a fraction of the shape's exhaustive
    runs (the Budget's runs, per shape)."""

    name: str
    strategy: str
    options: Options | None = None
    budget_fraction: float | None = None
    final: FinalRule | None = None  # the final step's rule; None: tune's defaults
    inner: str = "default"  # what "budgeted" runs under its budget
    runs: int | None = None  # a fixed budget of runs (budget_fraction: one per shape)

    @property
    def registered(self) -> str:
        """The registered strategy that runs (an alias resolved as tune resolves it, on a GPU)."""
        name = self.inner if self.strategy == "budgeted" else self.strategy
        return for_device("model_pruned", "cuda") if name == "default" else name

    def options_for(self, shape: ReplayShape, dims: ProblemDims) -> Options:
        """The options that run on `shape`: "default" takes the default effort's preset (as tune does)
        over its own, and its stage-1 values under its own."""
        registered = STRATEGIES[self.registered]
        options = registered.options() if self.options is None else self.options
        if (self.inner if self.strategy == "budgeted" else self.strategy) == "default":
            stage1 = {**template_stage1(), **getattr(options, "stage1", {})}
            options = options.given(**registered.efforts.get("default", {}), stage1=stage1)
        return options.given(problem=dims)

    def runs_for(self, shape: ReplayShape) -> int | None:
        return self.runs if self.budget_fraction is None else int(self.budget_fraction * len(shape.choices))


FLUSH_MS = 0.037  # one L2 flush by the GPU timer on an H200 (docs/ARCHITECTURE.md)


def choice_seconds(ms: float, rep_ms: float = 10.0, flush_ms: float = FLUSH_MS, min_reps: int = 5,
                   max_reps: int = 50) -> float:
    """Estimated seconds `CudaTimer.time` spends on a kernel of `ms`: a warm-up run, then the timer's
    own number of flushed runs (`gemmtune.measure.timers.planned_runs`; the defaults are Settings').

    Example:
        >>> round(choice_seconds(0.02) * 1e3, 3), round(choice_seconds(5.0), 3)
        (2.87, 0.03)
    """
    return (ms + planned_runs(ms, flush_ms, rep_ms, min_reps, max_reps) * (ms + flush_ms)) / 1e3


def pooled_times(shape: ReplayShape, m: int) -> dict[Choice, float]:
    """Each timed choice's recorded time as the median over its kernel's repeats on `m` rows: choices
    that run one kernel (`templates.base.kernel_key`: with one row of tiles, every swizzle of a Triton
    tile) were timed several times, and their single readings differ by the timer's noise only.

    Example:
        >>> from gemmtune.core.choices import as_params
        >>> tile = lambda s: Choice("triton_mm", "h", as_params({"BLOCK_M": 16}), as_params({"swizzle": s}),
        ...                         family="triton")
        >>> s = ReplayShape((16, 64, 64), {tile(1): 1.0, tile(2): 0.8, tile(4): 1.1, Choice("lib", None): 0.95})
        >>> sorted(pooled_times(s, 16).values())
        [0.95, 1.0, 1.0, 1.0]
    """
    groups = repeat_groups([c for c, ms in shape.times.items() if ms is not None], m)
    return {c: statistics.median(shape.times[x] for x in group) for group in groups for c in group}


def repeat_groups(choices: Sequence[Choice], m: int) -> list[list[Choice]]:
    """`choices` grouped by the kernel each runs on `m` rows (`templates.base.kernel_key`), in order.

    Example:
        >>> [len(g) for g in repeat_groups([Choice("a", None), Choice("b", None)], 16)]
        [1, 1]
    """
    groups: dict[tuple, list[Choice]] = {}
    for c in choices:
        groups.setdefault(kernel_key(c, m), []).append(c)
    return list(groups.values())


def run_one(shape: ReplayShape, spec: StrategySpec, dims: ProblemDims, parallel: int = 16,
            rep_ms: float = 10.0, pooled: bool = False) -> ShapeResult:
    """Replay `spec` on one shape, its final step included.  The search and the final see the single
    recorded readings; `pooled` reads the pick's regret by `pooled_times` instead (the best choice
    too), so that a repeat that read low is not the yardstick.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> s = ReplayShape((8, 8, 8), {Choice("lib", None): 1.0, Choice("t", "h", family="t"): 0.995})
        >>> r = run_one(s, StrategySpec("e", "exhaustive"), ProblemDims(8, 8, 8))
        >>> r.winner, round(r.regret_pct, 3)  # the final keeps the library kernel: 0.5% is within its margin
        ('lib', 0.503)
    """
    d = decide(shape, spec.registered, spec.options_for(shape, dims), spec.final, spec.runs_for(shape))
    truth = pooled_times(shape, dims.M) if pooled else shape.times
    best = min(v for v in truth.values() if v is not None)
    regret = 100.0 * (truth[d.pick] / best - 1.0) if d.pick is not None else math.inf
    binaries = {c.binary_key for c in d.timed if not c.is_extern}
    est = sum(shape.compile_s.get(k, 0.0) for k in binaries) / max(1, parallel)
    est += sum(choice_seconds(ms, rep_ms) for ms in (shape.times.get(c) for c in d.timed) if ms)
    return ShapeResult(shape.shape, shape.name, d.pick.key if d.pick else None, regret, len(d.timed),
                       len(shape.choices), len(binaries), est, shape.problem)


def simulate(shapes: Sequence[ReplayShape], strategies: Sequence[StrategySpec],
             dims: Sequence[ProblemDims] | None = None, parallel: int = 16, rep_ms: float = 10.0,
             pooled: bool = False) -> SimulationReport:
    """Replay every strategy on every shape; `dims` default to (M, N, K), batch 1, 2-byte elements;
    `pooled`: regret read by `pooled_times` (see `run_one`).

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> s = ReplayShape((64, 64, 64), {Choice("a", None): 1.0, Choice("b", None): 2.0})
        >>> rep = simulate([s], [StrategySpec("exhaustive", "exhaustive")])
        >>> rep["exhaustive"].max_regret_pct, rep["exhaustive"].work_fraction
        (0.0, 1.0)
    """
    dims = list(dims) if dims is not None else [ProblemDims(s.shape[0], s.shape[2], s.shape[1]) for s in shapes]
    return SimulationReport(tuple(
        StrategyResult(spec.name, tuple(run_one(s, spec, d, parallel, rep_ms, pooled) for s, d in zip(shapes, dims)))
        for spec in strategies))


def stage1_values(shapes: Sequence[ReplayShape]) -> list[dict[str, dict[str, Any]]]:
    """Every stage-1 setting the data allows: each template's recorded runtime values, crossed."""
    per_uid: dict[str, set] = {}
    for s in shapes:
        for c in s.choices:
            if not c.is_extern and c.runtime:
                per_uid.setdefault(c.template_uid, set()).add(c.runtime)
    uids = sorted(per_uid)
    return [{u: dict(rt) for u, rt in zip(uids, combo)} for combo in itertools.product(*(sorted(per_uid[u]) for u in uids))]


def default_specs(shapes: Sequence[ReplayShape]) -> list[StrategySpec]:
    """exhaustive; prescreen X in {1,2,3,5,8,10} x every stage-1 value; model_pruned N in {10,20,40,80};
    budgeted prescreen at 25% and 50% of exhaustive runs; default.

    Example:
        >>> names = [s.name for s in default_specs([])]  # no recorded runtime values: X only
        >>> names[:3], names[-4:]
        (['exhaustive', 'prescreen[x=1]', 'prescreen[x=2]'], ['model_pruned[n=80]', 'budgeted[25%,prescreen]', 'budgeted[50%,prescreen]', 'default'])
    """
    base = default_options()  # tune's top X, stage 0 N and stage-1 values (model_pruned's)
    specs = [StrategySpec("exhaustive", "exhaustive")]
    for x in (1, 2, 3, 5, 8, 10):
        for st in stage1_values(shapes):
            label = "".join(f",{k}={v}" for rt in st.values() for k, v in rt.items())
            specs.append(StrategySpec(f"prescreen[x={x}{label}]", "prescreen", PrescreenOptions(top_x=x, stage1=st)))
    specs += [StrategySpec(f"model_pruned[n={n}]", "model_pruned", base.given(stage0_n=n)) for n in (10, 14, 20, 40, 80)]
    specs += [StrategySpec(f"budgeted[{int(f * 100)}%,prescreen]", "budgeted", default_options(strategy="prescreen"), f,
                           inner="prescreen")
              for f in (0.25, 0.5)]
    specs.append(StrategySpec("default", "default", base))
    return specs


def select_specs(specs: Sequence[StrategySpec], names: Sequence[str]) -> list[StrategySpec]:
    """Specs named exactly, or every spec of a registered strategy (`prescreen` -> all prescreen[...])."""
    chosen: list[StrategySpec] = []
    for name in names:
        found = [s for s in specs if name in (s.name, s.strategy)]
        if not found and (name in STRATEGIES or name in ALIASES):
            spec = StrategySpec(name, name)
            found = [replace(spec, options=default_options(strategy=spec.registered))]
        if not found:
            raise ValueError(f"strategy: unknown {name!r}; {_known(specs)}")
        chosen += [s for s in found if s not in chosen]
    return chosen


def _known(specs: Sequence[StrategySpec], shown: int = 8) -> str:
    """The strategies, and the first `shown` spec names of each family (the rest counted), for an error line."""
    families: dict[str, list[str]] = {}
    for spec in specs:
        if spec.name != spec.strategy:
            families.setdefault(spec.name.split("[")[0], []).append(spec.name)
    named = [n for names in families.values() for n in names[:max(1, shown // max(1, len(families)))]]
    more = sum(len(names) for names in families.values()) - len(named)
    return (f"strategies: {', '.join(sorted({*STRATEGIES, *ALIASES}))}; specs such as {', '.join(named)}"
            + (f" ({more} more: gemmtune simulate --all shows them)" if more else ""))


def without_library(shapes: Sequence[ReplayShape]) -> list[ReplayShape]:
    """The shapes with library kernels removed, so regret measures the template search alone."""
    return [replace(s, times={c: ms for c, ms in s.times.items() if not c.is_extern},
                    failed=tuple(c for c in s.failed if not c.is_extern)) for s in shapes]


def load(path: str | Path) -> tuple[list[ReplayShape], list[ProblemDims]]:
    """Replay shapes and their problem dims (batch and element size from gemmtune datasets: the size of
    A's dtype, as `tune` gives its cost model, so one byte for an fp8 problem)."""
    meta, shapes = load_dataset(path)
    recs = [r for r in read_lines(path) if r.get("type") == "shape"] if meta.get("type") == "meta" else []
    dims = []
    for i, s in enumerate(shapes):
        rec = recs[i] if i < len(recs) else {}
        dims.append(ProblemDims(s.shape[0], s.shape[2], s.shape[1], int(rec.get("batch") or 1),
                                parse_dtype(rec.get("dtype") or "bfloat16").itemsize))
    return shapes, dims


def load_shipped() -> tuple[list[ReplayShape], list[ProblemDims]]:
    """The dataset shipped inside the package (`gemmtune/data/h200_suite.jsonl.gz`)."""
    from importlib.resources import as_file, files

    res = files("gemmtune").joinpath(SHIPPED)
    if not res.is_file():
        raise ValueError(f"no dataset given and this install ships none (gemmtune/{SHIPPED}): pass --dataset FILE "
                         "(a `gemmtune sweep` output or a reference sweep, docs/ARCHITECTURE.md)")
    with as_file(res) as p:
        return load(p)


def dataset_source(path: str | Path | None) -> str:
    """Where the timings of `path` (None: the shipped dataset) come from: the device and date its meta
    line records (`simulate_report.source_line`).

    Example:
        >>> dataset_source(None)
        'timings recorded on an NVIDIA H200 on 2026-11-30 (gemmtune/data/h200_suite.jsonl.gz, shipped with gemmtune)'
    """
    if path is not None:
        first = next(read_lines(path), {})
        return source_line(first if first.get("type") == "meta" else {}, str(path))
    from importlib.resources import as_file, files

    with as_file(files("gemmtune").joinpath(SHIPPED)) as shipped:
        return source_line(next(read_lines(shipped), {}), f"gemmtune/{SHIPPED}, shipped with gemmtune")


def by_op(shapes: Sequence[ReplayShape], dims: Sequence[ProblemDims], op: str | None = None,
          ) -> dict[str, tuple[list[ReplayShape], list[ProblemDims]]]:
    """The shapes (and dims) of each op, in the order the data first holds them; `op`: that op's alone.
    Each op is replayed and reported on its own, so an fp8 sweep's regret never pools with a bf16 one's.
    A shape with no correct timing (a lone candidate is not timed) says nothing about a search: left out.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> s = [ReplayShape((8, 8, 8), {Choice("a", None): 1.0}, op=op) for op in ("mm", "scaled_mm", "mm")]
        >>> {op: len(group[0]) for op, group in by_op(s, [ProblemDims(8, 8, 8)] * 3).items()}
        {'mm': 2, 'scaled_mm': 1}
    """
    groups: dict[str, tuple[list[ReplayShape], list[ProblemDims]]] = {}
    for shape, dim in zip(shapes, dims):
        if shape.times and op in (None, shape.op):
            group = groups.setdefault(shape.op, ([], []))
            group[0].append(shape)
            group[1].append(dim)
    if not groups:
        held = sorted({s.op for s in shapes if s.times})
        raise ValueError(f"--op: the dataset holds no timed {op} shape (it holds {', '.join(held) or 'none'})" if op
                         else "the dataset holds no shape with a correct timing")
    return groups


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gemmtune simulate", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", help=f"recorded timings (default: the shipped gemmtune/{SHIPPED})")
    p.add_argument("--strategy", nargs="+", action="extend", default=[], metavar="NAME",
                   help="spec names (e.g. 'model_pruned[n=20]') or strategy names (all their specs), every one "
                        "of them shown; default: all, the table showing exhaustive, default and each family's best")
    p.add_argument("--all", action="store_true", help="show every simulated strategy in the table")
    p.add_argument("--op", choices=OPS, default=None,
                   help="replay this op's shapes alone (default: each op of the data, reported apart)")
    p.add_argument("--json", dest="json_path", help="write the report as JSON here")
    p.add_argument("--plot", help="write a regret-vs-work plot here (needs matplotlib; one per op, "
                   "PATH-OP.png, when the data holds several)")
    p.add_argument("--no-library", action="store_true", help="drop library kernels: regret of the template search alone")
    p.add_argument("--parallel", type=int, default=16, help="compile workers assumed by est_tuning_s")
    p.add_argument("--pooled", action="store_true",
                   help="read regret against the median of each kernel's repeats (every swizzle of a tile with "
                        "one row of tiles runs one kernel), not against single readings")
    return p


def simulate_main(argv: Sequence[str] | None = None) -> int:
    """`gemmtune simulate [--dataset FILE] [--strategy NAME ...] [--op OP] [--json PATH] [--plot PATH]`.

    Example:
        gemmtune simulate --dataset sweep.jsonl.gz --strategy default prescreen
    """
    import sys

    from rich.console import Console

    from ..core.text import fit, output_width

    args = _parser().parse_args(argv)
    console = Console(highlight=False, width=output_width(sys.stdout))
    say = lambda text: console.print("\n".join(fit([text], console.width)), markup=False, soft_wrap=True)  # noqa: E731
    try:
        shapes, dims = load(args.dataset) if args.dataset else load_shipped()
        shapes = without_library(shapes) if args.no_library else shapes
        groups = by_op(shapes, dims, args.op)
        say(dataset_source(args.dataset))
        untimed = [s.name for s in shapes if not s.times and args.op in (None, s.op)]
        if untimed:
            say(f"left out {len(untimed)} shapes with no correct timing: {', '.join(untimed)}")
        reports = {}
        for op, (op_shapes, op_dims) in groups.items():
            specs = default_specs(op_shapes)
            reports[op] = simulate(op_shapes, select_specs(specs, args.strategy) if args.strategy else specs, op_dims,
                                   args.parallel, pooled=args.pooled)
            shown = None if args.all or args.strategy else headline(reports[op])
            console.print(render_table(reports[op], f"gemmtune simulate: {len(op_shapes)} shapes ({op})", shown))
            if shown is not None and len(shown) < len(reports[op].strategies):
                say(f"{len(shown)} of {len(reports[op].strategies)} strategies shown: exhaustive (the yardstick), "
                    "default (what tune runs) and each family's best (least max regret, then median, then work); "
                    "--all shows every one, --json writes them")
        _write(reports, args.json_path, args.plot)
    except (ValueError, OSError, RuntimeError) as exc:  # one plain line: no rich markup, which would eat "[x=5,...]"
        sys.stderr.write(f"gemmtune simulate: error: {' '.join(str(exc).split())}\n")
        return 2
    return 0


def _write(reports: dict[str, SimulationReport], json_path: str | None, plot: str | None) -> None:
    """The JSON (one op: its report; several: `{"ops": {op: report}}`) and the plots (one per op)."""
    if json_path:
        (doc,) = [r.to_json() for r in reports.values()] if len(reports) == 1 else [
            {"ops": {op: r.to_json() for op, r in reports.items()}}]
        Path(json_path).write_text(json.dumps(doc, indent=1) + "\n")
    if plot:
        for op, report in reports.items():
            path = Path(plot)
            plot_regret_vs_work(report, path if len(reports) == 1 else path.with_name(f"{path.stem}-{op}{path.suffix}"))


if __name__ == "__main__":
    import sys

    sys.exit(simulate_main())

__all__ = ["StrategySpec", "ShapeResult", "StrategyResult", "SimulationReport", "simulate", "run_one",
           "default_specs", "select_specs", "stage1_values", "without_library", "load", "load_shipped", "pooled_times",
           "repeat_groups",
           "by_op", "simulate_main", "render_table", "plot_regret_vs_work", "headline", "dataset_source"]
