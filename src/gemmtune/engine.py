"""tune(): one GEMM problem, end to end.  It reads as the list of its steps:

    plan_for(settings) -> store.recall(plan.key) -> prune -> compile -> Bench(plan.budget, runner)
    -> strategy.search -> final -> store.remember

The plan (`gemmtune.pipeline.plan`) is the only reader of Settings; the middle steps are the
pipeline an offline replay runs too (`gemmtune.pipeline.steps`); the store's policy (staleness,
provisional picks, racing writers) is `gemmtune.store.memory`'s.
"""

from __future__ import annotations

import logging
import platform
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .core import autocast
from .core.choices import Choice, Selection, Timing
from .core.errors import InputError, LayoutError, NoCandidatesError
from .core.inputs import KernelInputs, place_operands
from .core.binding import layout_kernel
from .core.layout import OUT_LAYOUTS, FixedLayout, effective_layout
from .core.settings import Settings
from .measure import deferred
from .measure.bench import Listener
from .measure.compile import CompileJob, CompileResult, Launchers
from .measure.factory import runner_for
from .measure.runners import Runner
from .pipeline.plan import Plan, plan_for
from .pipeline.progress import stage_lines
from .pipeline.steps import Recalled, search
from .store import distributed, kernels
from .store.checked import wrong_output
from .store.locations import shared_store
from .store.lookup import LookupTable
from .store.memory import Memory, recall
from .store.sqlite import Store
from .templates import heuristics, skipped_note
from .templates.base import Template

log = logging.getLogger("gemmtune")
__all__ = ["tune", "shared_store", "device_name"]


@autocast.tunes_cast_problem
def tune(op: str, *tensors: torch.Tensor, device: str | torch.device | None = None,
         backends: Sequence[str] | None = None, strategy: str | None = None,
         settings: Settings | None = None, alpha: float = 1.0, beta: float = 1.0,
         out_layout: str | None = None, finalize: Sequence[heuristics.FinalizeHook] = (),
         templates: Sequence[Template] | None = None, store: Store | None = None,
         listener: Listener | None = None, store_tag: str | None = None, group: Any = None,
         out_dtype: torch.dtype | None = None, use_fast_accum: bool = False, progress: bool | None = None) -> Selection:
    """Tune one `mm`, `addmm`, `bmm` or `scaled_mm` problem and return the Selection.

    `tensors` are the op's arguments in torch order (addmm: bias, mat1, mat2; scaled_mm: a, b, scale_a, scale_b[,
    bias], with its `out_dtype` (default bfloat16) and `use_fast_accum`: docs/FP8.md). `device` moves them first;
    `backends` is a tuple of family names from `gemmtune.FAMILIES` (`("extern",)`: library kernels only); `strategy`
    names one of `gemmtune.search.STRATEGIES` (default `settings.strategy`, "model_pruned", on CPU "prescreen");
    `out_layout` is None/"row", "col" (strides (1, M); only while the selection is flexible) or "padded"
    (`core.layout`).  Timings and the pick are kept in the persistent store (`settings.store`, or `store`), so a
    second tune of the same problem is a cache hit.  `store_tag` keeps a pick made for another purpose apart in the
    store (e.g. "traced": chosen among the templates a `torch.compile` trace can emit).  An option of the wrong kind
    is an InputError (`backends`, `strategy`: a BackendError). Under `torch.autocast` the operands are cast as torch
    would cast them for the op, and that problem is tuned (its Selection then accepts the same autocast call).  In a
    torch.distributed job the problem is tuned once, on one rank of `group`, and shared (a ProcessGroup; default:
    the group of the enclosing `gemmtune.distributed_group` block, else the default group).  `progress`: stage lines
    on stderr ("gemmtune: 25 choices, 9 binaries: compiling (0.0 s)"); None (default): off a terminal, for a tune
    still running after a second and no `listener`; False: none (`gemmtune.pipeline.progress`).

    Example:
        >>> import torch, gemmtune
        >>> a, b = torch.randn(64, 32), torch.randn(32, 16)
        >>> sel = gemmtune.tune("mm", a, b, backends=("extern",), progress=False)
        >>> torch.allclose(sel(a, b), a @ b)
        True
    """
    started = time.perf_counter()
    asked = {k: v for k, v in (("backends", backends), ("strategy", strategy)) if v is not None}
    settings = (settings or Settings.from_env()).with_(**asked)
    ki, tensors, out_layout = _problem(op, tensors, device, alpha, beta, out_layout, out_dtype, use_fast_accum)
    plan = plan_for(settings, ki, templates, started=started, out_layout=out_layout, store_tag=store_tag)
    store = store if store is not None else shared_store(plan.store, plan.trust)
    if plan.store != "off":  # before any template asks Triton anything; a tune of no store (the M-bucket
        kernels.sharing(store if plan.share_kernels else None)  # builds) keeps the process's sharing as it is
    choices = _choices(ki, plan, op, finalize)
    layout = _check_out_layout(ki, choices, out_layout)
    with stage_lines(progress, listener) as listen:
        ctx = _Context(ki, tensors, plan, listen, out_layout, store)
        job = distributed.current(*plan.distributed, group=group)
        if job is not None:  # a torch.distributed job: tuned once, on the problem's owner, and shared
            return job.share(ctx.store, plan.key.where(), lambda: _tune_here(ctx, choices, layout, started),
                             distributed.pool_digest(choices, plan))
        return _tune_here(ctx, choices, layout, started)


def _tune_here(ctx: "_Context", choices: list[Choice], layout: Any, started: float) -> Selection:
    """The tune of one problem in this process: the store's answer, or a search."""
    plan = ctx.plan
    memory = recall(ctx.store, plan.key, choices)
    ctx.emit("choices", total=len(choices), binaries=len({c.binary_key for c in choices}))
    if memory.full_hit(choices, exhaustive=plan.exhaustive):
        if (hit := ctx.from_store(choices, memory, layout, started)) is not None:
            return hit
    outcome = search(plan, choices, Recalled(memory.known, memory.unknown(choices), memory.trusted_pick, memory),
                     ctx.compile, ctx.open_runner, describe=ctx.ki.describe(), device_type=ctx.ki.device_type,
                     listener=ctx.emit)
    winner = memory.remember(choices, outcome.bench.records, outcome.compiled.failures, outcome.decision.choice,
                             strategy=outcome.stored_strategy(plan.asked), provisional=outcome.decision.provisional,
                             cut_short=outcome.bench.budget_exhausted, check=ctx.fault)
    outcome.log_pick(ctx.ki.describe(), winner)
    return ctx.selection(winner, outcome.timings(choices), layout, started,
                         **outcome.facts(plan.name, from_store=len(memory.known), stale_entries=memory.stale))


def _problem(op: str, tensors: Sequence[Any], device: str | torch.device | None, alpha: float, beta: float,
             out_layout: str | None, out_dtype: Any, fast: Any) -> tuple[KernelInputs, tuple, str | None]:
    """The validated problem, its operands (moved to `device`, detached) and its output layout
    (`core.layout.effective_layout`: "padded" rows that are whole already are row-major)."""
    if out_layout not in OUT_LAYOUTS:
        raise InputError(f"out_layout: expected None, 'row', 'col' or 'padded', got {out_layout!r}")
    placed = place_operands(tensors, device)
    ki = KernelInputs.from_tensors(op, *placed, alpha=alpha, beta=beta, out_dtype=out_dtype, fast_accum=fast)
    empty = [f"{k}={v}" for k, v in {"M": ki.M, "N": ki.N, "K": ki.K, "batch": ki.batch}.items() if v == 0]
    if empty:
        raise InputError(f"{ki.describe()}: nothing to tune, {', '.join(empty)} (the product is empty or all bias)")
    return ki, placed, effective_layout(out_layout, ki.N, ki.result_dtype.itemsize)


def _choices(ki: KernelInputs, plan: Plan, op: str, finalize: Sequence[heuristics.FinalizeHook]) -> list[Choice]:
    """Every candidate of every active template, in one heuristics call (hooks and lookup table applied)."""
    hooks: list[heuristics.FinalizeHook] = [*finalize]
    if plan.lookup_table:
        hooks.append(LookupTable.load(plan.lookup_table))
    choices = heuristics.get_template_configs(ki, plan.templates, op, hooks)
    if not choices:
        raise NoCandidatesError(f"{ki.describe()}: no template offers a candidate for {ki.dtype} on {ki.device} "
                                f"with backends={plan.backends}{skipped_note(plan.backends)}")
    return choices


def _check_out_layout(ki: KernelInputs, choices: Sequence[Choice], out_layout: str | None):
    layout = choices[0].layout
    if out_layout == "col" and isinstance(layout, FixedLayout):
        generated = sorted({c.template_uid for c in choices if not c.is_extern})
        raise LayoutError(f"{ki.describe()}: out_layout='col' cannot be honoured: generated templates "
                          f"({', '.join(generated)}) are candidates, so the output layout was fixed row-major "
                          f"before code generation; use backends=('extern',) to keep it flexible")
    return layout


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine() or "cpu"


@dataclass
class _Context:
    """One tune's problem, operands, plan and store, and the binaries compiled for it."""

    ki: KernelInputs
    tensors: tuple
    plan: Plan
    emit: Listener
    out_layout: str | None
    store: Store

    def __post_init__(self) -> None:
        self.templates = {t.uid: t for t in self.plan.templates}
        self.launchers = self._launchers(CompileResult())

    def _launchers(self, compiled: CompileResult) -> Launchers:
        return Launchers(self.templates, self.ki, self.tensors, timeout_s=self.plan.compile.timeout_s,
                         compiled=compiled)

    def compile(self, choices: Sequence[Choice], overlap: bool = False) -> CompileResult:
        """Compile `choices`' binaries; with `overlap` return at once (a CompileJob still running)."""
        describe = self.ki.describe()
        log.info("gemmtune: %s: compiling %d binaries for %d choices", describe, len({c.binary_key for c in choices}),
                 len(choices))
        job = CompileJob(choices, self.templates, self.ki, self.tensors, timeout_s=self.plan.compile.timeout_s,
                         workers=self.plan.compile.workers_for(overlap), deadline=self.plan.budget.compile_deadline,
                         on_done=lambda done, total: self.emit("compile", done=done, total=total))
        self.launchers = self._launchers(job if overlap else job.finish())
        compiled = self.launchers.compiled
        log.info("gemmtune: %s: compile %s", describe, "continues while timing" if overlap else
                 f"done in {compiled.seconds:.3f} s ({len(compiled.failures)} failed)")
        return compiled

    def open_runner(self) -> Runner:
        """The runner the plan chose (a worker process, or this process where isolation is unavailable)."""
        return runner_for(self.plan.runner.isolation, self.plan.runner.settings, self.ki, self.tensors,
                          self.templates, self.out_layout, self.ensure_compiled)

    def ensure_compiled(self, choice: Choice):
        """The launcher of `choice`, compiling it now if it was skipped (its timing came from the store)."""
        return self.launchers(choice)

    def from_store(self, choices: Sequence[Choice], memory: Memory, layout, started: float) -> Selection | None:
        """A full hit: no search; only the stored winner is compiled (in a warm-up, later: `measure.deferred`)."""
        winner = memory.pick
        assert winner is not None  # a full hit has a usable stored pick
        later = deferred.for_pick(self.store, winner, choices, self.ensure_compiled, self.ki)
        try:
            later or self.ensure_compiled(winner)  # compiled now: an unusable pick is found before the Selection
        except NoCandidatesError as exc:
            log.warning("gemmtune: stored pick unusable, tuning again: %s", exc)
            return None
        if not later and memory.check(winner, lambda: self.fault(winner)) is not None:
            return None  # a shared store's pick that computes something else: dropped, tuned again
        self.emit("compile", done=1, total=1)
        log.info("gemmtune: %s: cache hit: %s from the store, nothing timed", self.ki.describe(), winner.key)
        timings = tuple(sorted((memory.known.get(c) or Timing(c, None, "skipped", "not_benchmarked") for c in choices),
                               key=lambda t: (t.ms is None, t.ms or 0.0)))
        return self.selection(winner, timings, layout, started, later, strategy="store", benchmark_runs=0,
                              compile_s=self.launchers.compiled.seconds, benchmark_s=0.0, prescreen_s=0.0,
                              cache_hit=True, from_store=len(memory.known), stale_entries=0)

    def fault(self, choice: Choice) -> str | None:
        """Why `choice` (read from the store) computes something else on the tune's operands, else None."""
        run = layout_kernel(self.ki, choice.runtime_dict, self.ensure_compiled(choice), self.out_layout)
        return wrong_output(self.ki, lambda: run(*self.tensors), self.tensors)

    def selection(self, winner: Choice, timings: tuple[Timing, ...], layout: Any, started: float,
                  later: Any = None, **facts: Any) -> Selection:
        """The one place a Selection is assembled (a search's outcome, or a store hit; `later`: its deferred build)."""
        launch = later or self.ensure_compiled(winner)
        if self.plan.share_kernels and not later and self.plan.store != "off":  # "off": nowhere to keep them
            kernels.publish(self.store, self.launchers.compiled.binaries.get(winner.binary_key, ()))
        return Selection(problem=self.ki, winner=winner, timings=timings, layout=layout,
                         tuning_s=time.perf_counter() - started, device_name=device_name(self.ki.device),
                         kernel=layout_kernel(self.ki, winner.runtime_dict, launch, self.out_layout),
                         out_layout=self.out_layout or "row",
                         **facts)
