"""`gemmtune sweep`: record every candidate's time for every shape of a suite.

Each shape is tuned exhaustively (every template, config and runtime value,
plus the library kernels) with the store off and no finalist re-timing, so
each choice's time is the timer's own measurement.  The library kernel is
timed before and after the shape as a drift marker.  Lines are appended and
flushed one shape at a time; a rerun skips shapes already in the file, so an
interrupted sweep continues where it stopped (a last line cut short by a kill
is dropped first).  With `rounds` (`--rounds N`) every correct choice is then
re-timed in N interleaved rounds, as tune's final re-times its finalists, and
its record holds that median and its spread: one reading per choice is noisy
where kernels are short (docs/FP8.md, "Repeats of one kernel"); on CPU only the
choices within 2x of the fastest are re-timed (`Bench.retime`).  A scaled_mm shape is recorded as the other ops are, its
record holding what keys it besides the shape: scales, output dtype, fast
accumulation (docs/ARCHITECTURE.md).
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
from ..measure.timers import timer_for
from ..core.errors import InputError
from ..core.settings import Settings
from ..store.sqlite import env_info
from ..templates.base import Template
from .suite import ProblemSpec

EVERY = 1_000_000
"""`finalists` for a sweep with `rounds`: every correct choice reaches the interleaved re-time."""

LIBRARY = {"mm": "torch.mm", "bmm": "torch.bmm", "addmm": "torch.addmm", "scaled_mm": "torch._scaled_mm"}
"""The library call timed before and after each shape of an op: the sweep's drift marker."""


def _done(path: Path, log: Callable[[str], None]) -> set[str]:
    if not path.exists():
        return set()
    _drop_torn_line(path, log)
    return {f"{r['name']}|{r['problem_key']}" for r in read_lines(path) if r.get("type") == "shape"}


def _drop_torn_line(path: Path, log: Callable[[str], None]) -> None:
    """Cut a last line that a kill left without its newline (each record is one write that ends in one)."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1
    with open(path, "r+b") as f:
        f.truncate(keep)
    log(f"{path}: dropped a last line cut short ({len(data) - keep} bytes): its shape is recorded again")


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _library_ms(spec: ProblemSpec, tensors, timer) -> float:
    if spec.op == "scaled_mm":
        (a, b, scale_a, scale_b), kw = tensors, spec.tune_kwargs
        return timer.time(lambda: torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=kw["out_dtype"],
                                                   use_fast_accum=kw["use_fast_accum"])).cost_ms
    a, b = tensors[-2], tensors[-1]
    fn = {"mm": lambda: torch.mm(a, b), "bmm": lambda: torch.bmm(a, b),
          "addmm": lambda: torch.addmm(tensors[0], a, b)}[spec.op]
    return timer.time(fn).cost_ms


def _header(out: Path, device: str, settings: Settings, timer, command: str, rounds: int) -> None:
    if not out.exists() or out.stat().st_size == 0:
        out.parent.mkdir(parents=True, exist_ok=True)
        _append(out, {"type": "meta", "format": FORMAT, "env": env_info(device), "device": device,
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "timer": {"kind": type(timer).__name__, "gpu_rep_ms": settings.gpu_rep_ms,
                                "cpu_rep_ms": settings.cpu_rep_ms, "min_reps": settings.min_reps,
                                "max_reps": settings.max_reps, "l2_flush": settings.l2_flush if device.startswith("cuda") else None,
                                "count_host_overhead": settings.count_host_overhead,
                                "statistic": "median",
                                "rounds": rounds},
                      "command": command})


def sweep(specs: Sequence[ProblemSpec], out: str | Path, device: str, settings: Settings | None = None,
          log: Callable[[str], None] = print, command: str = "", slots: Sequence[Any] = (),
          templates: Sequence[Template] | None = None, rounds: int = 0) -> int:
    """Record `specs` into the dataset `out`; returns how many shapes were added.  `slots` (more than
    one GPU of the host, `offline.gpus.slots_for`): the shapes are dealt across those of `device`'s kind.
    `templates` replaces the pool the device's families give (as `gemmtune.tune`'s own argument).
    `rounds` > 0: every correct choice re-timed in that many interleaved rounds (module docstring).

    Example:
        sweep(load_suite("bench/shapes_fp8.json"), "fp8.jsonl", "cuda")
    """
    out = Path(out)
    if rounds < 0:
        raise InputError(f"--rounds: must be 0 (each choice's own timing) or more, got {rounds}")
    settings = (settings or Settings()).with_(strategy="exhaustive", store="off",
                                              **({"finalists": EVERY, "finalist_rounds": rounds} if rounds else
                                                 {"finalists": 1}))
    keys = [f"{spec.name}|{spec.kernel_inputs(spec.tensors(device)).problem_key}" for spec in specs]  # checks all
    timer = timer_for(device, settings)
    done = _done(out, log)
    _header(out, device, settings, timer, command, rounds)
    todo = []
    for spec, key in zip(specs, keys):
        if key in done:
            log(f"{spec.name}: already recorded, skipped")
        else:
            todo.append(spec)

    def append(record: dict, line: str) -> None:
        _append(out, record)
        log(line)

    if slots:
        from .gpus import sweep_shapes

        return sweep_shapes(todo, [RecordShape(s, settings, templates) for s in todo], slots, device, append)
    for spec in todo:
        append(*record_shape(spec, device, settings, timer, templates))
    return len(todo)


@dataclass(frozen=True)
class RecordShape:
    """One sweep shape recorded in a worker, on the worker's device: the dataset's shape record."""

    spec: ProblemSpec
    settings: Settings
    templates: Sequence[Template] | None = None

    def run_on(self, device: str) -> tuple[dict, str]:
        return record_shape(self.spec, device, self.settings, timer_for(device, self.settings), self.templates)


def problem_fields(spec: ProblemSpec) -> dict[str, Any]:
    """The problem as a shape record holds it: the suite's fields, and scaled_mm's scales, output dtype and
    fast accumulation (so `ProblemSpec.from_record` rebuilds the same problem, and the same problem key).

    Example:
        >>> problem_fields(ProblemSpec(16, 32, 16, op="scaled_mm", dtype="float8_e4m3fn", b_layout="col",
        ...                            scales="rowwise"))["out_dtype"]
        'bfloat16'
    """
    fields = {"name": spec.name, "op": spec.op, "M": spec.M, "K": spec.K, "N": spec.N, "batch": spec.batch,
              "dtype": spec.dtype, "b_layout": spec.b_layout}
    if spec.op == "scaled_mm":
        fields.update(scales=spec.scales, out_dtype=spec.out_dtype, fast_accum=spec.fast_accum)
    return fields


def record_shape(spec: ProblemSpec, device: str, settings: Settings, timer: Any,
                 templates: Sequence[Template] | None = None) -> tuple[dict, str]:
    """Tune `spec` exhaustively on `device` (library drift marker before and after): its dataset
    record and the line that reports it."""
    tensors = spec.tensors(device)
    ki = spec.kernel_inputs(tensors)
    t0 = time.perf_counter()
    start_ms = _library_ms(spec, tensors, timer)
    sel = tune(spec.op, *tensors, settings=settings, templates=templates, **spec.tune_kwargs)
    end_ms = _library_ms(spec, tensors, timer)
    compile_s = getattr(sel, "binary_seconds", {})
    choices = [{"template": t.choice.template_uid, "src_hash": t.choice.src_hash, "family": t.choice.family,
                "config": t.choice.config_dict, "runtime_params": t.choice.runtime_dict, "ms": t.ms,
                "status": t.status, "gpu_ms": t.gpu_ms, "host_ms": t.host_ms, "spread": t.spread,
                "interleaved": t.stage == "finalist", "compile_s": compile_s.get(t.choice.binary_key)}
               for t in sel.timings]
    record = {"type": "shape", **problem_fields(spec), "problem_key": ki.problem_key,
              "drift": {"library": LIBRARY[spec.op], "start_ms": start_ms, "end_ms": end_ms},
              "compile_total_s": sel.compile_s, "wall_s": time.perf_counter() - t0, "choices": choices}
    best = "untimed" if sel.winner_ms is None else f"{sel.winner_ms:.4f} ms"  # a lone candidate is not timed
    return record, (f"{spec.name}: {len(choices)} choices, best {sel.winner.key} {best}, "
                    f"library {start_ms:.4f} -> {end_ms:.4f} ms, {time.perf_counter() - t0:.1f} s")
