"""`gemmtune sweep`: record every candidate's time for every shape of a suite.

Each shape is tuned exhaustively (every template, config and runtime value,
plus the library kernels) with the store off and no finalist re-timing, so
each choice's time is the timer's own measurement.  The library kernel is
timed before and after the shape as a drift marker.  Lines are appended and
flushed one shape at a time; a rerun skips shapes already in the file, so an
interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .dataset import FORMAT, read_lines
from ..engine import tune
from ..core.inputs import KernelInputs
from ..measure.timers import timer_for
from ..core.settings import Settings
from ..store.sqlite import env_info
from .suite import ProblemSpec


def _done(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {f"{r['name']}|{r['problem_key']}" for r in read_lines(path) if r.get("type") == "shape"}


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _library_ms(spec: ProblemSpec, tensors, timer) -> float:
    a, b = tensors[-2], tensors[-1]
    fn = {"mm": lambda: torch.mm(a, b), "bmm": lambda: torch.bmm(a, b),
          "addmm": lambda: torch.addmm(tensors[0], a, b)}[spec.op]
    return timer.time(fn).cost_ms


def _header(out: Path, device: str, settings: Settings, timer, command: str) -> None:
    if not out.exists() or out.stat().st_size == 0:
        out.parent.mkdir(parents=True, exist_ok=True)
        _append(out, {"type": "meta", "format": FORMAT, "env": env_info(device), "device": device,
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "timer": {"kind": type(timer).__name__, "gpu_rep_ms": settings.gpu_rep_ms,
                                "cpu_rep_ms": settings.cpu_rep_ms, "min_reps": settings.min_reps,
                                "max_reps": settings.max_reps, "l2_flush": settings.l2_flush if device.startswith("cuda") else None,
                                "count_host_overhead": settings.count_host_overhead,
                                "statistic": "median"},
                      "command": command})


def sweep(specs: Sequence[ProblemSpec], out: str | Path, device: str, settings: Settings | None = None,
          log: Callable[[str], None] = print, command: str = "", slots: Sequence[Any] = ()) -> int:
    """Record `specs` into the dataset `out`; returns how many shapes were added.  `slots` (more than
    one GPU of the host, `offline.gpus.slots_for`): the shapes are dealt across those of `device`'s kind."""
    out = Path(out)
    settings = (settings or Settings()).with_(strategy="exhaustive", finalists=1, store="off")
    timer = timer_for(device, settings)
    _header(out, device, settings, timer, command)
    done, todo = _done(out), []
    for spec in specs:
        if f"{spec.name}|{KernelInputs.from_tensors(spec.op, *spec.tensors(device)).problem_key}" in done:
            log(f"{spec.name}: already recorded, skipped")
        else:
            todo.append(spec)

    def append(record: dict, line: str) -> None:
        _append(out, record)
        log(line)

    if slots:
        from .gpus import sweep_shapes

        return sweep_shapes(todo, [RecordShape(s, settings) for s in todo], slots, device, append)
    for spec in todo:
        append(*record_shape(spec, device, settings, timer))
    return len(todo)


@dataclass(frozen=True)
class RecordShape:
    """One sweep shape recorded in a worker, on the worker's device: the dataset's shape record."""

    spec: ProblemSpec
    settings: Settings

    def run_on(self, device: str) -> tuple[dict, str]:
        return record_shape(self.spec, device, self.settings, timer_for(device, self.settings))


def record_shape(spec: ProblemSpec, device: str, settings: Settings, timer: Any) -> tuple[dict, str]:
    """Tune `spec` exhaustively on `device` (library drift marker before and after): its dataset
    record and the line that reports it."""
    tensors = spec.tensors(device)
    ki = KernelInputs.from_tensors(spec.op, *tensors)
    t0 = time.perf_counter()
    start_ms = _library_ms(spec, tensors, timer)
    sel = tune(spec.op, *tensors, settings=settings)
    end_ms = _library_ms(spec, tensors, timer)
    compile_s = getattr(sel, "binary_seconds", {})
    choices = [{"template": t.choice.template_uid, "src_hash": t.choice.src_hash, "family": t.choice.family,
                "config": t.choice.config_dict, "runtime_params": t.choice.runtime_dict, "ms": t.ms,
                "status": t.status, "gpu_ms": t.gpu_ms, "host_ms": t.host_ms,
                "compile_s": compile_s.get(t.choice.binary_key)} for t in sel.timings]
    record = {"type": "shape", "name": spec.name, "op": spec.op, "M": spec.M, "K": spec.K, "N": spec.N,
              "batch": spec.batch, "dtype": spec.dtype, "b_layout": spec.b_layout,
              "problem_key": ki.problem_key, "drift": {"library": f"torch.{spec.op}",
                                                       "start_ms": start_ms, "end_ms": end_ms},
              "compile_total_s": sel.compile_s, "wall_s": time.perf_counter() - t0, "choices": choices}
    best = "untimed" if sel.winner_ms is None else f"{sel.winner_ms:.4f} ms"  # a lone candidate is not timed
    return record, (f"{spec.name}: {len(choices)} choices, best {sel.winner.key} {best}, "
                    f"library {start_ms:.4f} -> {end_ms:.4f} ms, {time.perf_counter() - t0:.1f} s")
