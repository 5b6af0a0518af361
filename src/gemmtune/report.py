"""The AUTOTUNE table (Inductor's format) and the JSON form of a Selection."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import torch
from contextlib import contextmanager
from typing import Any, Iterator

from .core.choices import Choice, Selection, Timing
from .core.inputs import dtype_name


def describe_choice(choice: Choice) -> str:
    """Config as `K=V, ...` followed by the runtime params (`swizzle=8`)."""
    cfg = ", ".join(f"{k}={v}" for k, v in choice.config)
    rt = " ".join(f"{k}={v}" for k, v in choice.runtime)
    if choice.is_extern:
        cfg = "library kernel"
    return f"{cfg} {rt}".strip()


STAGE_LABELS = {"prescreen": "prescreen", "final": "final", "finalist": "interleaved final", "store": "store",
                "pinned": "pinned"}
LEGEND = ("stage: interleaved final = re-timed together, decides the pick; final = timed alone; prescreen = one "
          "short run; store = an earlier tune. % = winner's time / row's time")


def autotune_table(sel: Selection, rows: int | None = 20) -> str:
    """Inductor-style AUTOTUNE report for one Selection, with the stage each time comes from.

    Rows are sorted by time, fastest first, each with the stage its time comes from; the winner's row
    carries the time that decided it (a faster row from a cheaper stage did not take part in the final);
    a legend line says what the stages mean.

    Example (shape of the output):
        AUTOTUNE mm(512x512, 512x512)
        strides: [512, 1], [512, 1]
        dtypes: torch.float32, torch.float32
          numba_gemm 0.8500 ms 105.9% prescreen          MR=8, NR=8
          aten_mm    0.9000 ms 100.0% interleaved final  library kernel  <- winner
        stage: interleaved final = re-timed together, decides the pick; ...
        SingleProcess AUTOTUNE benchmarking takes 0.5 seconds and 0.1 seconds precompiling for 20 choices and 0.2 seconds prescreening
    """
    ki = sel.problem
    lines = [
        f"AUTOTUNE {ki.describe()}",
        "strides: " + ", ".join(str(list(o.stride)) for o in ki.operands),
        "dtypes: " + ", ".join(f"torch.{dtype_name(o.dtype)}" for o in ki.operands),
    ]
    timed = ordered_rows(sel)
    shown = timed if rows is None else timed[:rows]
    if not timed:
        lines.append(f"  {sel.winner.name} (not timed: {_untimed_reason(sel)}) {describe_choice(sel.winner)}"
                     f"  <- winner")
    lines += _time_rows(sel, shown)
    if len(shown) < len(timed):
        lines.append(f"  ... {len(timed) - len(shown)} more timed choices (see --json)")
    lines += _failure_lines(sel)
    if timed:
        lines.append(LEGEND)
    lines.append(summary_line(sel))
    return "\n".join(lines)


def ordered_rows(sel: Selection) -> list[Timing]:
    """The timed rows of `sel`, fastest first.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> a, b = Choice("aten_mm", None), Choice("numba_gemm", "h", family="numba")
        >>> sel = Selection(None, a, (Timing(a, 2.0, "finalist"), Timing(b, 1.0, "prescreen")), None, "prescreen",
        ...                 2, 0.0, 0.0, 0.0, 0.0, "cpu")
        >>> [t.choice.name for t in ordered_rows(sel)]
        ['numba_gemm', 'aten_mm']
    """
    return sorted((t for t in sel.timings if t.ms is not None), key=lambda t: t.ms or 0.0)


def _time_rows(sel: Selection, shown: list[Timing]) -> list[str]:
    deciding = sel.winner_ms
    width = max((len(t.choice.name) for t in shown), default=0)
    finalists = [t for t in shown if t.stage == "finalist"]
    out = []
    for t in shown:
        mark = ""
        if t.choice == sel.winner:
            mark = "  <- winner"
            if t.choice.is_extern and t.ms is not None and any(f.ms is not None and f.ms < t.ms for f in finalists):
                mark += " (library kernel kept: no generated kernel beat it by the library margin)"
        pct = 100.0 * deciding / t.ms if deciding and t.ms else 0.0
        stage = STAGE_LABELS.get(t.stage, t.stage)
        out.append(f"  {t.choice.name:<{width}} {t.ms:.4f} ms {pct:5.1f}% {stage:<17} {describe_choice(t.choice)}{mark}")
    return out


def _failure_lines(sel: Selection) -> list[str]:
    lines = []
    for t in sel.timings:
        if t.detail.startswith("BudgetExceeded"):
            continue
        if t.status in ("wrong_result", "run_failed", "compile_failed"):
            lines.append(f"  {t.choice.name} {describe_choice(t.choice)}: {t.status.replace('_', ' ')}: {t.detail}")
    if sel.budget_exhausted:
        cut = sum(t.detail.startswith("BudgetExceeded") or t.status == "not_benchmarked" for t in sel.timings)
        lines.append(f"tuning stopped at the time budget (--budget-s): the winner is the best found so far; "
                     f"{cut} choices not compiled or not timed")
    return lines + _noise_lines(sel)


def _noise_lines(sel: Selection) -> list[str]:
    """What the timer's noise did to the decision (CPU timings on a loaded machine, mostly)."""
    lines = []
    if sel.noisy:
        lines.append("note: the top choices were within the timing noise of each other; " + (
            "the library kernel keeps a tie" if sel.winner.is_extern else
            "the pick beat the library kernel by more than the noise and the library margin"))
    busy = sel.background_load
    if sel.provisional and busy is not None and busy > 0.5:
        lines.append(f"note: other processes kept {busy:.1f} cores busy while the choices were timed, so the times "
                     "may read high; the pick is stored as provisional and re-checked by a later run that holds the store "
                     "alone")
    elif sel.provisional:
        lines.append("note: decided under heavy timing noise: the pick is stored as provisional and re-checked by "
                     "a later run that holds the store alone")
    return lines


def _untimed_reason(sel: Selection) -> str:
    """Why the winner has no time: it was the only candidate that could run, so nothing was compared."""
    if sel.strategy != "pinned":
        return sel.strategy
    ki = sel.problem
    others = sum(t.choice != sel.winner for t in sel.timings)
    why = (f"{others} other candidates failed" if others else
           f"no other template supports {dtype_name(ki.dtype)} on {ki.device_type}, or a lookup table or hook "
           f"pinned this one")
    return f"the only candidate ({why}), so there was nothing to compare"


def summary_line(sel: Selection) -> str:
    mode = "SubProcess" if sel.isolation == "subprocess" else "SingleProcess"
    overlap = " (overlapping prescreening)" if sel.overlapped else ""
    return (f"{mode} AUTOTUNE benchmarking takes {sel.benchmark_s:.4f} seconds and "
            f"{sel.compile_s:.4f} seconds precompiling{overlap} for {sel.n_choices} choices and "
            f"{sel.prescreen_s:.4f} seconds prescreening")


def selection_dict(sel: Selection) -> dict[str, Any]:
    """Everything about a Selection as plain JSON data."""
    ki = sel.problem
    return {
        "problem": {**ki.to_dict(), "key": ki.problem_key, "M": ki.M, "K": ki.K, "N": ki.N, "batch": ki.batch},
        "device_name": sel.device_name,
        "strategy": sel.strategy,
        "winner": sel.winner.name,
        "winner_key": sel.winner.key,
        "winner_ms": sel.winner_ms,
        "winner_runtime_params": sel.winner.runtime_dict,
        "layout": sel.layout.kind,
        "out_layout": sel.out_layout,
        "cache_hit": sel.cache_hit,
        "budget_exhausted": sel.budget_exhausted,
        "noisy": sel.noisy,
        "provisional": sel.provisional,
        "background_load": sel.background_load,
        "from_store": sel.from_store,
        "stale_entries": sel.stale_entries,
        "benchmark_runs": sel.benchmark_runs,
        "compile_s": sel.compile_s,
        "compile_overlapped": sel.overlapped,
        "benchmark_s": sel.benchmark_s,
        "prescreen_s": sel.prescreen_s,
        "tuning_s": sel.tuning_s,
        "n_choices": sel.n_choices,
        "choices": [{**t.choice.to_dict(), "ms": t.ms, "gpu_ms": t.gpu_ms, "host_ms": t.host_ms, "stage": t.stage,
                     "status": t.status, "detail": t.detail}
                    for t in sel.timings],
    }


def run_info() -> dict[str, Any]:
    """The versions a result was produced with and when: the `--json` output's `versions` and `timestamp`.

    Example:
        >>> info = run_info()
        >>> sorted(info["versions"]), "T" in info["timestamp"]
        (['gemmtune', 'numba', 'numpy', 'torch', 'triton'], True)
    """
    from .core.version import __version__
    from .store.env import package_version

    versions: dict[str, str | None] = {"gemmtune": __version__, "torch": torch.__version__}
    versions.update({name: package_version(name) for name in ("triton", "numba", "numpy")})
    return {"versions": versions, "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_json(data: Any, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, default=str) + "\n")


def summary_table(results: Any) -> Any:
    """`gemmtune tune --suite`'s summary, a rich Table: one row per (spec, Selection) of `results`; '-' where
    there is no time (a single untimed candidate, e.g. bf16 on CPU)."""
    from rich.table import Table

    table = Table(title="gemmtune summary")
    for col in ("shape", "problem", "winner", "ms", "TFLOP/s", "best extern ms", "vs extern", "choices",
                "runs", "tuning s"):
        table.add_column(col, justify="left" if col in ("shape", "problem", "winner") else "right",
                         overflow="fold")
    for spec, sel in results:
        ext = [t.ms for t in sel.timings if t.choice.is_extern and t.ms is not None]
        ext_ms, ms = (min(ext) if ext else None), sel.winner_ms
        table.add_row(spec.name or "-", spec.describe(), sel.winner.key,
                      f"{ms:.4f}" if ms else "-", f"{sel.problem.flops / ms / 1e9:.3g}" if ms else "-",
                      f"{ext_ms:.4f}" if ext_ms else "-", f"{ext_ms / ms:.3f}x" if ext_ms and ms else "-",
                      str(sel.n_choices), str(sel.benchmark_runs), f"{sel.tuning_s:.2f}")
    return table


class StageLines:
    """Off a terminal (stderr piped or a file): one line per stage of a tune instead of a bar.

    Example:
        >>> lines = []
        >>> listen = StageLines(lines.append)
        >>> listen("choices", total=26, binaries=8); listen("compile", done=8, total=8)
        >>> listen("benchmark", done=1, total=26); listen("benchmark", done=2, total=26)
        >>> [line.split(" (")[0] for line in lines]
        ['26 choices, 8 binaries: compiling', 'compiled 8 binaries', 'benchmarking 26 choices']
    """

    def __init__(self, write: Any):
        import time

        self.write, self.clock, self.started = write, time.perf_counter, time.perf_counter()
        self.seen: set[str] = set()

    def __call__(self, event: str, **info: Any) -> None:
        elapsed = f" ({self.clock() - self.started:.1f} s)"
        if event == "choices":
            self.write(f"{info['total']} choices, {info['binaries']} binaries: compiling{elapsed}")
        elif event == "compile" and info["done"] >= info["total"] and "compile" not in self.seen:
            self.seen.add("compile")
            self.write(f"compiled {info['total']} binaries{elapsed}")
        elif event == "benchmark" and "benchmark" not in self.seen:
            self.seen.add("benchmark")
            self.write(f"benchmarking {info['total']} choices{elapsed}")


@contextmanager
def progress_listener(console: Any) -> Iterator[Any]:
    """A progress bar on `console` (a rich Console) for one tune: compiling and benchmarking; gone when it ends."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as prog:
        tasks: dict[str, TaskID] = {}

        def listen(event: str, **info: Any) -> None:
            if event == "choices":
                for k in list(tasks):
                    prog.remove_task(tasks.pop(k))
                tasks["compile"] = prog.add_task("compiling", total=info["binaries"])
                tasks["benchmark"] = prog.add_task("benchmarking", total=info["total"])
            elif event in tasks:
                prog.update(tasks[event], completed=info["done"], total=max(info["total"], info["done"]))

        yield listen
