"""The AUTOTUNE table (Inductor's format) and the JSON form of a Selection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .core.choices import Choice, Selection
from .core.inputs import dtype_name


def describe_choice(choice: Choice) -> str:
    """Config as `K=V, ...` followed by the runtime params (`swizzle=8`)."""
    cfg = ", ".join(f"{k}={v}" for k, v in choice.config)
    rt = " ".join(f"{k}={v}" for k, v in choice.runtime)
    if choice.is_extern:
        cfg = "library kernel"
    return f"{cfg} {rt}".strip()


def autotune_table(sel: Selection, rows: int | None = 20) -> str:
    """Inductor-style AUTOTUNE report for one Selection.

    Example (shape of the output):
        AUTOTUNE mm(512x512, 512x512)
        strides: [512, 1], [512, 1]
        dtypes: torch.float32, torch.float32
          aten_mm 0.9000 ms 100.0% library kernel
        SingleProcess AUTOTUNE benchmarking takes 0.5 seconds and 0.1 seconds precompiling for 20 choices and 0.2 seconds prescreening
    """
    ki = sel.problem
    lines = [
        f"AUTOTUNE {ki.describe()}",
        "strides: " + ", ".join(str(list(o.stride)) for o in ki.operands),
        "dtypes: " + ", ".join(f"torch.{dtype_name(o.dtype)}" for o in ki.operands),
    ]
    timed = [t for t in sel.timings if t.ms is not None]
    best = min((t.ms for t in timed), default=0.0)
    shown = timed if rows is None else timed[:rows]
    width = max((len(t.choice.name) for t in shown), default=0)
    if not timed:
        lines.append(f"  {sel.winner.name} (not timed: {sel.strategy}) {describe_choice(sel.winner)}  <- winner")
    for t in shown:
        mark = "  <- winner" if t.choice == sel.winner else ""
        lines.append(f"  {t.choice.name:<{width}} {t.ms:.4f} ms {100.0 * best / t.ms:5.1f}% {describe_choice(t.choice)}{mark}")
    if len(shown) < len(timed):
        lines.append(f"  ... {len(timed) - len(shown)} more timed choices (see --json)")
    for t in sel.timings:
        if t.detail.startswith("BudgetExceeded"):
            continue
        if t.status in ("wrong_result", "run_failed", "compile_failed"):
            lines.append(f"  {t.choice.name} {describe_choice(t.choice)}: {t.status.replace('_', ' ')}: {t.detail}")
    if sel.budget_exhausted:
        cut = sum(t.detail.startswith("BudgetExceeded") or t.status == "not_benchmarked" for t in sel.timings)
        lines.append(f"tuning stopped at the time budget (--budget-s): the winner is the best found so far; "
                     f"{cut} choices not compiled or not timed")
    lines.append(summary_line(sel))
    return "\n".join(lines)


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


def write_json(data: Any, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, default=str) + "\n")
