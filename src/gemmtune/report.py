"""The AUTOTUNE table (Inductor's format) and the JSON form of a Selection."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from dataclasses import dataclass
from pathlib import Path

import torch
from contextlib import contextmanager
from typing import Any, Iterator

from .core.choices import Choice, Selection, Timing, torch_op
from .core.inputs import dtype_name
from .pipeline.progress import StageLines  # noqa: F401 - the stage lines off a terminal (`gemmtune tune`)


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
          "short run; store = an earlier tune. % = winner's time / row's time. (best of N): N runtime values of the "
          "kernel were timed, the row shows the one the search kept")
STAGE_RANK = {"prescreen": 0, "final": 1, "finalist": 2, "store": 2, "pinned": 2}
LOST = {
    "not re-timed": "a time from a cheaper stage (prescreen: one short run; final: timed alone) that the final "
                    "did not re-time; the final's interleaved times decide the pick",
    "library margin": "the library kernel is kept unless a generated kernel beats it by the library margin "
                      "(Settings.library_margin) and by the timing noise",
    "launch cost": "faster back to back, but its host launch time costs more than it saves on the GPU "
                   "(Settings.launch_aware_final)",
    "stored pick": "times recalled from the store: the pick an earlier tune made stands",
    "final rules": "ranked below the winner by the final's rules (launch cost, then GPU time)",
}
"""Why a row faster than the winner lost: its short label (on the row) and the note that explains it."""


@dataclass(frozen=True)
class KernelRow:
    """One binary of a Selection in the AUTOTUNE table: the timing that stands for it (the winner's, or
    its best runtime value at its latest stage), how many runtime values were timed, and, for a row
    faster than the winner, why it lost (a key of `LOST`)."""

    timing: Timing
    values: int = 1
    lost: str = ""


def autotune_table(sel: Selection, rows: int | None = 20, width: int | None = None, legend: bool = False) -> str:
    """Inductor-style AUTOTUNE report for one Selection, at most `width` columns wide (default:
    `core.text.output_width()`, 100 when not on a terminal); prose wraps between words.

    One row per binary, its runtime values folded in (`group=16 (best of 3)`): the winner first, then the
    others fastest first, each with the stage its time comes from; a row faster than the winner says
    why it lost (a note explains).  A count line says how many choices there were and what became of
    them; with `legend` (the CLI's `-v`), a legend says what the stages, % and "(best of N)" mean.

    Example (shape of the output):
        AUTOTUNE mm(512x512, 512x512)
        strides: [512, 1], [512, 1]
        dtypes: torch.float32, torch.float32
        20 choices: 6 timed, in 2 rows (one per kernel); 14 pruned before timing
          aten_mm              0.9000 ms 100.0% interleaved final library kernel  <- winner
          numba_mm_bm64_bn64   0.8500 ms 105.9% prescreen         group=4 (best of 5)  lost: not re-timed
        note: lost: not re-timed: a time from a cheaper stage ...
        SingleProcess AUTOTUNE benchmarking takes 0.5 seconds and 0.1 seconds precompiling for 20
          choices and 0.2 seconds prescreening
    """
    from .core.text import fit, output_width

    ki = sel.problem
    lines = [
        f"AUTOTUNE {ki.describe()}",
        "strides: " + ", ".join(str(list(o.stride)) for o in ki.operands),
        "dtypes: " + ", ".join(f"torch.{dtype_name(o.dtype)}" for o in ki.operands),
    ]
    timed = ordered_rows(sel)
    shown = timed if rows is None else timed[:rows]
    if timed or sel.n_choices > 1:
        lines.append(count_line(sel, len(timed), len(shown)))
    if not timed:
        lines += [f"  {sel.winner.name} {describe_choice(sel.winner)}  <- winner",
                  f"    (not timed: {_untimed_reason(sel)})"]
    width = output_width() if width is None else width
    lines += _time_rows(sel, shown, width)
    if len(shown) < len(timed):
        lines.append(f"  ... {len(timed) - len(shown)} more timed kernels (see --json)")
    lost = dict.fromkeys(r.lost for r in shown if r.lost)
    lines += _failure_lines(sel, [f"note: lost: {why}: {LOST[why]}" for why in lost])
    if timed and legend:
        lines.append(LEGEND)
    lines.append(summary_line(sel))
    return "\n".join(fit(lines, width))


def ordered_rows(sel: Selection) -> list[KernelRow]:
    """The timed binaries of `sel` (`KernelRow`): the winner first, then the others fastest first.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> a, b = Choice("aten_mm", None), Choice("numba_gemm", "h", family="numba")
        >>> sel = Selection(None, a, (Timing(a, 2.0, "finalist"), Timing(b, 1.0, "prescreen")), None, "prescreen",
        ...                 2, 0.0, 0.0, 0.0, 0.0, "cpu")
        >>> [(r.timing.choice.name, r.lost) for r in ordered_rows(sel)]
        [('aten_mm', ''), ('numba_gemm', 'not re-timed')]
    """
    groups: dict[tuple, list[Timing]] = {}
    for t in sel.timings:
        if t.ms is not None:
            groups.setdefault(t.choice.binary_key, []).append(t)
    mine = [t for t in sel.timings if t.choice == sel.winner and t.ms is not None]
    win = min(mine, key=lambda t: t.ms or 0.0) if mine else None
    rows = []
    for key, ts in groups.items():
        rep = win if win is not None and key == sel.winner.binary_key else max(
            ts, key=lambda t: (STAGE_RANK.get(t.stage, 0), -(t.ms or 0.0)))
        faster = win is not None and rep is not win and (rep.ms or 0.0) < (win.ms or 0.0)
        lost = _why_lost(sel, rep, win) if faster and win is not None else ""
        rows.append(KernelRow(rep, len({t.choice.runtime for t in ts}), lost))
    return sorted(rows, key=lambda r: (r.timing is not win, r.timing.ms or 0.0))


def _why_lost(sel: Selection, t: Timing, win: Timing) -> str:
    """The key of `LOST` that says why `t`, faster than the winner's `win`, is not the pick."""
    launch = None not in (t.host_ms, t.gpu_ms, win.host_ms, win.gpu_ms) and (t.host_ms or 0.0) > (win.host_ms or 0.0)
    if STAGE_RANK.get(t.stage, 0) < STAGE_RANK.get(win.stage, 0):
        return "not re-timed"
    if torch_op(sel.winner) and not torch_op(t.choice):
        return "launch cost" if launch and (t.gpu_ms or 0.0) < (win.gpu_ms or 0.0) else "library margin"
    if t.stage == "store":
        return "stored pick"
    return "launch cost" if launch else "final rules"


def count_line(sel: Selection, kernels: int, shown: int) -> str:
    """How many choices there were and what became of them: timed (in how many rows), pruned before
    timing, failed, cut by the time budget.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> a, b = Choice("aten_mm", None), Choice("numba_gemm", "h", family="numba")
        >>> sel = Selection(None, a, (Timing(a, 2.0, "final"), Timing(b, None, "skipped", "not_benchmarked")),
        ...                 None, "prescreen", 1, 0.0, 0.0, 0.0, 0.0, "cpu")
        >>> count_line(sel, 1, 1)
        '2 choices: 1 timed; 1 pruned before timing'
    """
    statuses = [(t.status, t.detail.startswith("BudgetExceeded")) for t in sel.timings if t.ms is None]
    n_timed = len(sel.timings) - len(statuses)
    cut = sum(over or (sel.budget_exhausted and s == "not_benchmarked") for s, over in statuses)
    pruned = 0 if sel.budget_exhausted else sum(s == "not_benchmarked" and not over for s, over in statuses)
    failed = sum(s in ("wrong_result", "run_failed", "compile_failed") and not over for s, over in statuses)
    other = len(statuses) - cut - pruned - failed
    timed = f"{n_timed} timed" + (f", in {kernels} rows (one per kernel)" if kernels != n_timed else "") + (
        f", {shown} shown" if shown < kernels else "")
    parts = [timed, f"{pruned} pruned before timing" if pruned else "", f"{failed} failed" if failed else "",
             f"{cut} cut by the time budget" if cut else "", f"{other} not timed" if other else ""]
    n = sel.n_choices
    return f"{n} choice{'s' if n != 1 else ''}: " + "; ".join(p for p in parts if p)


def _time_rows(sel: Selection, shown: list[KernelRow], width: int) -> list[str]:
    """One line per row; where that would pass `width`, the row's last cell (its runtime values and
    mark) goes on the next line, indented, and a name too long for its column goes on a line of its own."""
    deciding = sel.winner_ms
    cells = []
    for r in shown:
        t = r.timing
        mark = "  <- winner" if t.choice == sel.winner else f"  lost: {r.lost}" if r.lost else ""
        rt = " ".join(f"{k}={v}" for k, v in t.choice.runtime) + (f" (best of {r.values})" if r.values > 1 else "")
        desc = "library kernel" if t.choice.is_extern else rt
        pct = 100.0 * deciding / t.ms if deciding and t.ms else 0.0
        cells.append((t.choice.name, f"{t.ms:.4f}", f"{pct:5.1f}%", STAGE_LABELS.get(t.stage, t.stage),
                      f"{desc}{mark}".strip()))
    widths = [max((len(c[i]) for c in cells), default=0) for i in range(1, 4)]
    room = width - 2 - (widths[0] + widths[1] + widths[2] + 6)  # for the name: the rest of the row must fit
    name_w = max((len(c[0]) for c in cells if len(c[0]) < room), default=0)
    out = []
    for n, ms, share, st, rest in cells:
        if len(n) > name_w:
            out.append(f"  {n}")
            n = ""
        head = f"  {n:<{name_w}} {ms:>{widths[0]}} ms {share:>{widths[1]}} {st:<{widths[2]}}"
        out += [f"{head} {rest}".rstrip()] if len(head) + 1 + len(rest) <= width else [head.rstrip(), f"      {rest}"]
    return out


def _failure_lines(sel: Selection, lost: list[str]) -> list[str]:
    """The failed choices (one line per binary and failure), the notes in `lost`, the time budget's line
    and the timing noise's notes."""
    failed: dict[tuple, list[Choice]] = {}  # one line per binary and failure: its runtime values folded in
    for t in sel.timings:
        if t.status in ("wrong_result", "run_failed", "compile_failed") and not t.detail.startswith("BudgetExceeded"):
            failed.setdefault((t.choice.binary_key, t.status, t.detail), []).append(t.choice)
    lines = [f"  {cs[0].name}{_values(cs)}: {status.replace('_', ' ')}: {detail}"
             for (_, status, detail), cs in failed.items()] + lost
    if sel.budget_exhausted:
        cut = sum(t.detail.startswith("BudgetExceeded") or t.status == "not_benchmarked" for t in sel.timings)
        lines.append(f"tuning stopped at the time budget (--budget-s): the winner is the best found so far; "
                     f"{cut} choices not compiled or not timed")
    return lines + _noise_lines(sel)


def _values(choices: list[Choice]) -> str:
    """The runtime values of one binary's `choices`, each name's values together: ` (group=1/4/16)`.

    Example:
        >>> from gemmtune.core.choices import as_params
        >>> _values([Choice("t", "h", (), as_params({"group": g})) for g in (1, 4)]), _values([Choice("a", None)])
        (' (group=1/4)', ' (library kernel)')
    """
    if choices[0].is_extern:
        return " (library kernel)"
    names = dict.fromkeys(k for c in choices for k, _ in c.runtime)
    vals = {k: "/".join(dict.fromkeys(str(v) for c in choices for n, v in c.runtime if n == k)) for k in names}
    return f" ({', '.join(f'{k}={v}' for k, v in vals.items())})" if vals else ""


def _noise_lines(sel: Selection) -> list[str]:
    """What the timer's noise did to the decision (CPU timings on a loaded machine, mostly)."""
    lines = []
    if sel.noisy:
        lines.append("note: the top choices were within the timing noise of each other; " + (
            "the library kernel keeps a tie" if sel.winner.is_extern else
            "the pick beat the library kernel by more than the noise and the library margin"))
    if sel.second_reading:
        lines.append(f"note: a close call against the library kernel, decided by a second timer: {sel.second_reading}")
    busy = sel.background_load
    if sel.provisional and busy is not None and busy > 0.5:
        kept = "the library kernel is kept, " if sel.winner.is_extern else ""
        lines.append(f"note: other processes kept {busy:.1f} cores busy while the choices were timed, so the times "
                     f"may read high; {kept}stored as provisional: a later run that holds the store alone decides")
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
    if others and sel.budget_exhausted:
        return "the time budget ran out before any other candidate was timed"
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
        "decided_by": sel.decided_by or "first timer",
        "second_reading": sel.second_reading,
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
    there is no time (a single untimed candidate, e.g. bf16 on CPU).  Numbers never wrap; the names
    fold where the console is narrow (the CLI's: at most 100 columns, `core.text.output_width`).

    Example:
        >>> import io
        >>> from rich.console import Console
        >>> console = Console(width=80, file=io.StringIO())
        >>> console.print(summary_table([])); "gemmtune summary" in console.file.getvalue()
        True
    """
    from rich.table import Table

    caption = ("vs lib: the best library kernel's time over the pick's (above 1: the pick is faster); every time "
               "and count is in --json")
    table = Table(title="gemmtune summary", caption=caption, caption_justify="left")
    for col in ("shape", "winner", "ms", "TFLOP/s", "vs lib", "tune s"):
        text = col in ("shape", "winner")
        table.add_column(col, justify="left" if text else "right", overflow="fold", no_wrap=not text)
    for spec, sel in results:
        ext = [t.ms for t in sel.timings if t.choice.is_extern and t.ms is not None]
        ext_ms, ms = (min(ext) if ext else None), sel.winner_ms
        table.add_row(f"{spec.name}\n{spec.describe()}" if spec.name else spec.describe(), sel.winner.key,
                      f"{ms:.4f}" if ms else "-", f"{sel.problem.flops / ms / 1e9:.3g}" if ms else "-",
                      f"{ext_ms / ms:.3f}x" if ext_ms and ms else "-", f"{sel.tuning_s:.2f}")
    return table


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
