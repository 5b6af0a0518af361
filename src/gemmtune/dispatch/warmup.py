"""Model warm-up: one forward collects every GEMM problem of a model, then they are tuned together.

Without it, a patched model tunes each new GEMM problem inside its first forward, one stall per
layer shape.  `warmup` runs that forward with tuning held back (each GEMM is computed by torch and
its problem recorded), then tunes the distinct problems one after another with a progress bar, and
returns a report.  Problems already in the store are read, not tuned, so a second run of the same
program tunes nothing.  After `warmup` the model's eager calls, and `torch.compile` traces of it,
find every problem decided.

`warmup` then checks each pick that is not torch's own op in the model itself (`dispatch.in_model`):
the forward is timed with the pick and with torch's own op for that problem, and the pick stays only
where the forward runs faster with it.  On a GPU, back-to-back timing hides a launch's host cost
that a launch-bound eager forward pays in full; on CPU, a kernel on another thread pool (numba's,
NumPy's BLAS) fights torch's pool for the cores next to the model's other ops.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from . import checking, eager, fp8, ranges
from .buckets import buckets_for
from .in_model import InModel
from ..core.errors import InputError
from ..core.m_range import parse_m
from ..core.settings import Settings
from ..core.validate import check_model_options
from ..measure import deferred
from ..pipeline.progress import silenced
from ..store import distributed
from ..store.locations import shared_store
from .patching import patched_modules, repatch, repatch_released
from .release import release_library_layers
from .spread import as_tuned, prepare_for, spread

__all__ = ["warmup", "WarmupReport", "WarmupRow"]



@dataclass(frozen=True)
class WarmupRow:
    """One GEMM problem of the model and what tuning decided for it."""

    problem: str
    calls: int  # how often the forward met this problem
    winner: str
    ms: float | None  # the winner's time (None: pinned or not timed)
    library_ms: float | None  # the best library kernel's time, where it was timed
    seconds: float  # tuning (or store look-up) wall time
    from_store: bool
    in_model: InModel | None = None  # the in-model check's verdict (None: not checked)

    @property
    def runs(self) -> str:
        """What the model runs for this problem: the winner, or torch's op where the check said so."""
        return self.winner if self.in_model is None else self.in_model.runs

    @property
    def speedup(self) -> float | None:
        """Library time over winner time (>1: the pick beats the library kernel)."""
        if self.ms is None or self.library_ms is None or self.ms <= 0:
            return None
        return self.library_ms / self.ms


@dataclass(frozen=True)
class WarmupReport:
    """What `warmup` did: one row per distinct GEMM problem, and the wall time of it all."""

    rows: tuple[WarmupRow, ...]
    seconds: float
    forward_s: float
    check_s: float = 0.0  # the in-model check's wall time
    released: tuple[str, ...] = ()  # layers given back to torch's op (`dispatch.release`; the default of eager use)
    build_s: float = 0.0  # building the store's picks together (`measure.deferred`), outside the check

    def phases(self) -> dict[str, float]:
        """Where the warm-up's wall time went, in seconds: the recording forward, the tunes and store reads
        (the rows' own seconds), the deferred builds outside the check, the in-model check, and the rest
        (registering buckets, the release's forward)."""
        tune_s = sum(r.seconds for r in self.rows)
        parts = dict(forward=self.forward_s, tune=tune_s, build=self.build_s, check=self.check_s)
        return {k: round(v, 3) for k, v in dict(parts, rest=self.seconds - sum(parts.values())).items()}

    @property
    def tuned(self) -> int:
        return sum(not r.from_store for r in self.rows)

    @property
    def from_store(self) -> int:
        return sum(r.from_store for r in self.rows)

    def table(self, width: int | None = None) -> str:
        """The summary as plain text, at most `width` columns (default: `core.text.output_width()`, 100
        off a terminal): one line per problem, the winner last, then a total; prose wraps."""
        from ..core.text import columns, fit, output_width

        width = output_width() if width is None else width
        cells = []
        for r in self.rows:
            ms = f"{r.ms:.4f}" if r.ms is not None else "-"
            sp = f"{r.speedup:.3f}" if r.speedup is not None else "-"
            how = "store" if r.from_store else f"{r.seconds:.2f}"
            check = "-" if r.in_model is None else (f"{'kept' if r.in_model.kept else 'torch'} {r.in_model.q1:.3f}"
                                                    + (" all" if r.in_model.together else "")
                                                    + (" store" if r.in_model.stored else ""))
            cells.append([r.problem, str(r.calls), ms, sp, how, check, r.winner])
        table = columns(["problem", "calls", "ms", "x library", "tune s", "in model", "winner"], cells, width,
                        right=(1, 2, 3, 4))
        lines = [f"{len(self.rows)} GEMM problems: {self.tuned} tuned, {self.from_store} from the store; "
                     f"warm-up {self.seconds:.2f} s (forward {self.forward_s:.2f} s, builds {self.build_s:.2f} s, "
                     f"in-model check {self.check_s:.2f} s)"]
        if self.released:
            lines.append(f"released {len(self.released)} layers to torch's op (every problem they met runs it; a "
                         f"new input shape there is not tuned): {', '.join(self.released)}")
        if any(r.in_model is not None for r in self.rows):
            lines.append("in model: forward time with torch's op over forward time with the pick, lower quartile "
                         "of the rounds (the pick stays above 1 + library_margin; 'torch': the model runs torch's op; 'all': "
                         "decided for the picks together; 'store': the verdict kept for this model and machine)")
        return "\n".join(table + fit(lines, width))


def warmup(model: nn.Module, *example_inputs: Any, backends: Sequence[str] | None = None,
           progress: bool | None = None, for_compile: bool = False, in_model: bool | None = None,
           release: bool | None = None, group: Any = None, m: Any = None, inputs_at: Callable[[int], Any] | None = None,
           out_layout: str | None = None, **example_kwargs: Any) -> WarmupReport:
    """Tune every GEMM of `model(*example_inputs, **example_kwargs)` before it is used.

    `model`'s `nn.Linear` layers are patched first (`gemmtune.patch`, with `backends` and `out_layout`) unless they
    already are; then, where one is given, each keeps its own value of the other (`dispatch.patching.repatch`;
    `out_layout="row"`: the padded layout off). Calls of `gemmtune.mm` / `addmm` / `bmm` made by the model's own
    code are collected too, and so are its `torch._scaled_mm` calls (fp8 linear layers: the forward runs under
    `dispatch.fp8.ScaledMMRouter`); a model whose forward met one is routed (`gemmtune.patch(model,
    scaled_mm=True)`), so its later forwards run the picks (docs/FP8.md).  The forward runs once under
    `torch.no_grad()`. `for_compile=True` decides the problems for a later `torch.compile` of the model, in any
    mode: tuned among the kernels Inductor builds and stored where gemmtune's Inductor handler reads them, so the
    compile tunes and benchmarks nothing (`Settings.compile_path="traced"`: among the traceable templates, emitted
    at trace time).  `progress`: a progress bar (default: when standard error is a terminal; False: no bar, no stage
    lines).  Returns a `WarmupReport` (`report.table()`: the summary).

    `in_model` checks each pick that is not torch's own op in the model (`dispatch.in_model`): about 30 more
    forwards per such problem, under `torch.no_grad()`.  Its verdicts are kept in the store for this model,
    these picks and this machine, and a later warm-up applies them without timing (`dispatch.verdicts`);
    `in_model=True` times them again.  Default: on for eager models, off in a torch.distributed job (it would
    decide per rank).  Turn it off for a forward with side effects (a KV cache it appends to), or for a model
    run under a CUDA graph (launch cost does not count there). In a torch.distributed job the problems are dealt
    across the ranks of `group` (a ProcessGroup; default: that of the enclosing `gemmtune.distributed_group`
    block, else the default group).  On a host with more than one GPU of the model's kind (at most
    `Settings.gpus`), the problems are tuned at once in one worker process per GPU (docs/SCALE.md).

    `release` (default: on for eager use, off with `for_compile`) then takes the patch off every layer whose
    problems all run torch's op (`dispatch.release`, one more forward), so the warm-up costs eager use nothing where
    torch's op won; a new input shape there is no longer tuned (`release=False` keeps every layer patched: 1.5 % of
    a launch-bound model).  A warm-up first patches again the layers released before.

    `m` (a range, a list of M, or "LO:HI"; M = batch x tokens for a linear layer) also tunes each mm and
    addmm family at every bucket of M, so a later eager call at any M tunes nothing (`dispatch.ranges`);
    `inputs_at(M)` (the model's inputs at M: a tuple, a dict of keyword inputs, or one input) has the
    in-model check run at every bucket, not only at the example's (`dispatch.checking`).

    Example:
        >>> import torch, gemmtune
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        >>> report = gemmtune.warmup(mlp, torch.randn(5, 8), backends=("extern",), progress=False)
        >>> len(report.rows), report.rows[0].winner.startswith(("aten", "numpy"))
        (2, True)
    """
    release = _checked_options(model, backends, release, for_compile, m, inputs_at, progress, in_model)
    with distributed.distributed_group(group) if group is not None else contextlib.nullcontext(), _quiet(progress):
        return _warmup(model, example_inputs, example_kwargs, backends, progress, for_compile, in_model, release, m,
                       inputs_at, out_layout)


def _checked_options(model: Any, backends: Any, release: bool | None, for_compile: bool, m: Any,
                     inputs_at: Any = None, progress: Any = None, in_model: Any = None) -> bool:
    """`release` as asked (default: on for eager use, off with `for_compile`), once `m` is read
    (`core.m_range`); InputError for an option of the wrong kind, a bad `m` and options that do not go
    together, before the forward."""
    check_model_options("warmup", model, backends, release=release, for_compile=for_compile, progress=progress,
                        in_model=in_model)
    if m is not None:
        parse_m(m, "warmup: m")
    if inputs_at is not None and (m is None or not callable(inputs_at)):
        got = type(inputs_at).__name__ + ("" if m is not None else " without m=")
        raise InputError(f"warmup: inputs_at must be a function of M giving the model's inputs, with m= (the "
                         f"buckets it checks); got {got}")
    if m is not None and for_compile:
        raise InputError("warmup: m= decides eager calls by bucket; a torch.compile graph does not dispatch by "
                         "bucket (pass for_compile=False, or leave m out)")
    if release and for_compile:
        raise InputError("warmup: release=True applies to eager use; a torch.compile trace of a released "
                         "layer would not see gemmtune (pass for_compile=False, or release=False)")
    return not for_compile if release is None else release


def _quiet(progress: bool | None) -> Any:
    """progress=False: the tunes print no stage lines either (`gemmtune.tune`'s, off a terminal)."""
    return silenced() if progress is False else contextlib.nullcontext()


def _warmup(model: nn.Module, example_inputs: tuple, example_kwargs: dict, backends: Sequence[str] | None,
            progress: bool | None, for_compile: bool, in_model: bool | None, release: bool,
            m: Any = None, inputs_at: Callable[[int], Any] | None = None,
            out_layout: str | None = None) -> WarmupReport:
    started = time.perf_counter()
    repatch_released(model)  # an earlier warm-up's released layers: this one meets their problems too
    if not patched_modules(model) or backends is not None or out_layout is not None:
        repatch(model, backends, out_layout)  # a patched layer keeps its own value of an argument that is None
    forward = functools.partial(model, *example_inputs, **example_kwargs)
    with deferred.deferring() as pending:  # the store's generated picks: built together below
        rows, seen, forward_end = _record_and_tune(forward, model, _show(progress), for_compile)
        keys = list(seen)  # each row's dispatch key
        if m is not None:  # every bucket of M of each mm / addmm family the forward met
            buckets = ranges.bucket_problems(seen, m)
            with ranges.BUCKETS.tuning():  # a family an earlier range registered: its new buckets tuned too
                rows += [_row(problem, calls) for problem, calls in _tune_all(buckets, _show(progress), for_compile)]
            keys += list(buckets)
            ranges.register_buckets({**seen, **buckets})
    # On by default (GPU picks for launch cost, CPU ones for thread pools); in a distributed job only if asked.
    check = not for_compile and bool(in_model or (in_model is None and _job() is None))
    # Picks the kept verdicts send to torch's op are not built; with `inputs_at`, the picks a bucket's forward
    # meets are built before its check.
    t0 = time.perf_counter()
    predicted = checking.kept_to_torch(seen, model, bool(in_model)) if check else set()
    deferred.build_all(pending, skip=predicted, only=checking.pick_keys(seen) if check and inputs_at else None)
    build_s = time.perf_counter() - t0
    if any(rec.op == "scaled_mm" for rec in seen.values()) and not fp8.is_routed(model):
        fp8.route(model, backends)  # its torch._scaled_mm calls dispatch to the picks from now on
    check_s, sent = 0.0, set[str]()  # sent: the picks kept verdicts sent to torch's op
    if check:
        t0 = time.perf_counter()
        rows = _checked(rows, seen, keys, forward, model, example_kwargs, m, inputs_at, bool(in_model), pending, sent)
        check_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    deferred.build_all(pending, skip=sent)  # what no check built (a bucket no forward reached)
    deferred.release(pending, sent)  # never built: the tune's operands they hold go
    build_s += time.perf_counter() - t0
    keep = ranges.generated_somewhere if m is not None else None  # a range: torch's op in every bucket
    released = tuple(release_library_layers(model, forward, keep)) if release else ()
    return WarmupReport(tuple(rows), time.perf_counter() - started, forward_end - started, check_s, released, build_s)


def _checked(rows: list[WarmupRow], seen: dict, keys: list[tuple], forward: Any, model: nn.Module, kwargs: dict,
             m: Any, inputs_at: Callable[[int], Any] | None, again: bool, pending: Sequence[Any],
             sent: set) -> list[WarmupRow]:
    """`rows` with the in-model check's verdicts at the example's M, then, given `inputs_at`, at each bucket."""
    decided: set = set()  # (family, bucket) pairs decided: each once, the example's M first
    with torch.no_grad():
        rows = checking.checked(rows, seen, forward, model, again, decided, sent)
    if inputs_at is not None:
        rows = _bucket_checked(rows, keys, model, inputs_at, kwargs, m, again, decided, pending, sent)
    return rows


def _record_and_tune(forward: Any, model: nn.Module, show: bool,
                     for_compile: bool) -> tuple[list[WarmupRow], "dict[tuple, eager.Recorded]", float]:
    """The recording forward, then every problem it met tuned (or read from the store): (rows, the
    record, `time.perf_counter()` when the forward ended)."""
    cancel = _prestart_worker(model)  # its start overlaps the recording forward and the first compiles
    try:
        with eager.recording() as seen, torch.no_grad(), fp8.ScaledMMRouter():
            forward()
        forward_end = time.perf_counter()
        return [_row(problem, calls) for problem, calls in _tune_all(seen, show, for_compile)], seen, forward_end
    finally:
        cancel()  # nothing tuned (all from the store): the worker is not kept


def _prestart_worker(model: nn.Module) -> Any:
    """Start the isolation worker of the model's GPU in the background, where tuning there would
    use one; returns the `cancel` of `isolation.prestart` (a no-op where nothing was started)."""
    from ..measure import isolation
    from ..core.inputs import device_str
    from ..core.settings import Settings, isolation_for

    tensor = next((t for t in (*model.parameters(), *model.buffers()) if t.is_cuda), None)
    settings = Settings.from_env()
    if tensor is None or isolation_for(settings.isolation, "cuda") != "subprocess":
        return lambda: None
    return isolation.prestart(device_str(tensor.device), settings.run_timeout_s)


def _bucket_checked(rows: list[WarmupRow], keys: list[tuple], model: nn.Module, inputs_at: Callable[[int], Any],
                    kwargs: dict, m: Any, again: bool, decided: set, pending: Sequence[Any] = (),
                    sent: set | None = None) -> list[WarmupRow]:
    """`rows` (`keys`: their dispatch keys) with the verdicts of the in-model check at each bucket of `m`
    (`checking.check_buckets`): on the row of the problem decided, or a row of its own for a problem the
    range did not tune (an M not a bucket's).  `inputs_at(b)`: a tuple of positional inputs, a dict of
    keyword inputs (over the example's), or one input."""
    def forward_at(b: int) -> Any:
        inputs = inputs_at(b)
        if isinstance(inputs, dict):
            return functools.partial(model, **{**kwargs, **inputs})
        return functools.partial(model, *(inputs if isinstance(inputs, tuple) else (inputs,)), **kwargs)

    out, where = list(rows), {k: i for i, k in enumerate(keys)}
    checks = checking.check_buckets(forward_at, buckets_for(parse_m(m)), model, again, decided, pending, sent)
    for canon, rec, sel, verdict in checks:
        i = where.get(canon)
        if i is None:
            where[canon] = len(out)
            cached = bool(sel and sel.cache_hit)
            out.append(WarmupRow(verdict.problem, rec.calls, verdict.winner, None, None, 0.0, cached, verdict))
        else:
            out[i] = replace(out[i], in_model=verdict)
    return out


def _show(progress: bool | None) -> bool:
    return sys.stderr.isatty() if progress is None else progress


def _tune_all(seen: "dict[tuple, eager.Recorded]", show: bool, traced: bool) -> Iterator[tuple[Any, int]]:
    """Tune (or read from the store) each recorded problem; yield (timed outcome, calls).  In a
    torch.distributed job the problems are dealt first: each rank tunes its share, and the rows are
    exchanged (`store.distributed`), so the loop below finds every problem in the store.  On more than
    one GPU of the model's kind, each GPU's worker tunes its share first (`dispatch.spread`), likewise."""
    items = list(seen.values())
    job = _job()
    if job is not None:
        with job.dealing(shared_store(Settings.from_env().store)):  # the environment's trust
            for rec in items[job.rank::job.world]:
                _tune_one(rec, traced)
        with distributed.alone():
            yield from _tune_each(items, show, traced)
        return
    dealt = spread(items, traced)  # more than one GPU of the model's kind: each tunes its share first
    for i, (outcome, calls) in enumerate(_tune_each(items, show, traced)):
        yield as_tuned(outcome, dealt.get(i)), calls


def _job() -> Any:
    settings = Settings.from_env()
    return distributed.current(settings.distributed, settings.distributed_timeout_s)


def _tune_each(items: "list[eager.Recorded]", show: bool, traced: bool) -> Iterator[tuple[Any, int]]:
    if not show:
        for rec in items:
            yield _tune_one(rec, traced), rec.calls
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("warm-up"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("", total=len(items))
        for rec in items:
            bar.update(task, description=rec.describe())
            yield _tune_one(rec, traced), rec.calls
            bar.advance(task)


def _tune_one(rec: "eager.Recorded", traced: bool) -> tuple[Any, float]:
    t0 = time.perf_counter()
    if rec.op == "scaled_mm":  # eager and traced alike: a traced scaled_mm runs torch's op (dispatch/fp8.py)
        return fp8.prepare(rec.tensors, dict(rec.options), rec.backends), time.perf_counter() - t0
    sel = prepare_for(rec, traced)
    return sel, time.perf_counter() - t0


def _row(outcome: tuple[Any, float], calls: int) -> WarmupRow:
    sel, seconds = outcome
    if sel is None:  # an empty problem: torch computes it, nothing to tune
        return WarmupRow("empty problem", calls, "torch", None, None, seconds, False)
    timings = {t.choice: t for t in sel.timings}
    win = timings.get(sel.winner)
    lib = min((t.ms for t in sel.timings if t.choice.is_extern and t.ms is not None), default=None)
    laid = "" if sel.out_layout in (None, "row") else f" [{sel.out_layout}]"  # an output of other strides
    return WarmupRow(sel.problem.describe() + laid, calls, sel.winner.name, win.ms if win else None, lib, seconds,
                     bool(sel.cache_hit))
