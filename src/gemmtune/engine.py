"""tune(): one GEMM problem, end to end.  It reads as the list of its steps."""

from __future__ import annotations

import logging
import os
import platform
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from .templates import heuristics
from .measure import load
from .measure.bench import Bench, Listener
from .measure.factory import runner_for
from .core import autocast
from .core.choices import Choice, Selection, Timing
from .measure.compile import CompileJob, CompileResult, Launchers, overlap_for
from .core.errors import InputError, LayoutError, NoCandidatesError
from .core.inputs import KernelInputs, place_operands
from .core.layout import FixedLayout, empty_output
from .store.lookup import LookupTable
from .core.settings import CPU_CANNOT_WIN, Settings, isolation_for
from .store import distributed
from .store.checked import first_use_fault
from .store.locations import open_store
from .store.sqlite import Row, Store, canon, env_info, env_key
from .search import STRATEGIES, ProblemDims, StrategyOptions, for_device
from .search.final import Decision, FinalRule, final_decision
from .templates import active_templates, skipped_note
from .templates.base import Template

log = logging.getLogger("gemmtune")
OUT_LAYOUTS = (None, "row", "col")
RUN_STARTED = time.time()
RUN_ID = f"{os.getpid()}-{RUN_STARTED:.0f}"  # this process: a provisional pick is re-checked by a later run only
_STORES: dict[str, Store] = {}


@autocast.tunes_cast_problem
def tune(op: str, *tensors: torch.Tensor, device: str | torch.device | None = None,
         backends: Sequence[str] | None = None, strategy: str | None = None,
         settings: Settings | None = None, alpha: float = 1.0, beta: float = 1.0,
         out_layout: str | None = None, finalize: Sequence[heuristics.FinalizeHook] = (),
         templates: Sequence[Template] | None = None, store: Store | None = None,
         listener: Listener | None = None, store_tag: str | None = None) -> Selection:
    """Tune one `mm`, `addmm` or `bmm` problem and return the Selection.

    `tensors` are the op's arguments in torch order (addmm: bias, mat1, mat2).
    `device` moves them first; `backends` is a tuple of family names from
    `gemmtune.FAMILIES` (`("extern",)`: library kernels only); `strategy` names one
    of `gemmtune.search.STRATEGIES` (default `settings.strategy`, "model_pruned": a cost
    model prunes binaries before prescreening; on CPU it is "prescreen"); `out_layout` is None/"row" or
    "col" (strides (1, M); only while the selection is flexible).  Timings and
    the pick are kept in the persistent store (`settings.store`), so a second
    tune of the same problem is a cache hit.  `store_tag` keeps a pick made for another purpose
    apart in the store (e.g. "traced": chosen among the templates a `torch.compile` trace can emit).
    Under `torch.autocast` the operands are cast as torch would cast them for the op, and that problem
    is tuned (its Selection then accepts the same autocast call).

    Example:
        >>> import torch, gemmtune
        >>> a, b = torch.randn(64, 32), torch.randn(32, 16)
        >>> sel = gemmtune.tune("mm", a, b, backends=("extern",))
        >>> torch.allclose(sel(a, b), a @ b)
        True
    """
    started = time.perf_counter()
    settings = fit_budget((settings or Settings.from_env()).with_(
        **{k: v for k, v in (("backends", backends), ("strategy", strategy)) if v is not None}))
    ki, tensors = _problem(op, tensors, device, alpha, beta, out_layout)
    active = active_templates(ki, settings.backends, templates, settings.hopper_templates,
                              settings.config_space, settings.preview_templates)
    choices = _choices(ki, active, op, finalize, settings)
    layout = _check_out_layout(ki, choices, out_layout)
    ctx = _Context(ki, tensors, settings, {t.uid: t for t in active}, listener or (lambda event, **info: None),
                   out_layout,
                   store if store is not None else shared_store(settings.store), store_tag)
    job = distributed.current(settings.distributed, settings.distributed_timeout_s)
    if job is not None:  # a torch.distributed job: tuned once, on the problem's owner, and shared
        return job.share(ctx.store, (ctx.env, ctx.info, ctx.problem, ki.describe()),
                         lambda: _tune_here(ctx, choices, active, layout, started))
    return _tune_here(ctx, choices, active, layout, started)


def _tune_here(ctx: "_Context", choices: list[Choice], active: Sequence[Template], layout: Any,
               started: float) -> Selection:
    """The tune of one problem in this process: the store's answer, or a search."""
    ki, settings = ctx.ki, ctx.settings
    memory = ctx.recall(choices)
    ctx.emit("choices", total=len(choices), binaries=len({c.binary_key for c in choices}))
    if memory.full_hit(choices, exhaustive=settings.strategy == "exhaustive"):
        hit = ctx.from_store(choices, memory, layout, started)
        if hit is not None:
            return hit
    plan = _plan(ki, active, settings, started)
    # The strategy prunes before anything compiles (model_pruned: the cost model), so a pruned
    # binary is never built; its search then sees only what compiled.
    todo = STRATEGIES[plan.strategy].prune(memory.unknown(choices), plan.options)
    compiled = ctx.compile(todo, _compile_deadline(plan.deadline, settings, ki.device_type),
                           overlap=overlap_for(settings.overlap_compile, plan.isolation, ki.device_type))
    try:
        outcome = _measure_and_pick(ctx, compiled, choices, memory, plan)
    finally:
        compiled.abandon() if isinstance(compiled, CompileJob) else None
    # Replace a stored pick we re-tuned over (partial hit) or could not use (stale source);
    # a first pick is insert-if-absent so that racing processes agree on one.
    winner = ctx.remember(choices, outcome.bench, compiled, outcome.decision, replace=memory.stored_pick or False)
    _log_pick(ki, winner, outcome.bench)
    return ctx.selection(winner, _timings(choices, compiled, outcome.bench), layout, started,
                         **_facts(outcome, plan.strategy, compiled, memory))


def _log_pick(ki: KernelInputs, winner: Choice, bench: Bench) -> None:
    t = bench.records.get(winner)
    deciding = f"{t.ms:.4f} ms, stage {t.stage}" if t is not None and t.ms is not None else "none"
    log.info("gemmtune: %s: picked %s (deciding time: %s)", ki.describe(), winner.key, deciding)


def _problem(op: str, tensors: Sequence[Any], device: str | torch.device | None, alpha: float, beta: float,
             out_layout: str | None) -> tuple[KernelInputs, tuple]:
    """The validated problem and its operands (moved to `device`, detached)."""
    if out_layout not in OUT_LAYOUTS:
        raise InputError(f"out_layout: expected None, 'row' or 'col', got {out_layout!r}")
    placed = place_operands(tensors, device)
    ki = KernelInputs.from_tensors(op, *placed, alpha=alpha, beta=beta)
    _require_work(ki)
    return ki, placed


def _choices(ki: KernelInputs, active: Sequence[Template], op: str, finalize: Sequence[heuristics.FinalizeHook],
             settings: Settings) -> list[Choice]:
    """Every candidate of every active template, in one heuristics call (hooks and lookup table applied)."""
    hooks: list[heuristics.FinalizeHook] = [*finalize]
    if settings.lookup_table:
        hooks.append(LookupTable.load(settings.lookup_table))
    choices = heuristics.get_template_configs(ki, active, op, hooks)
    if not choices:
        raise NoCandidatesError(f"{ki.describe()}: no template offers a candidate for {ki.dtype} on {ki.device} "
                                f"with backends={settings.backends}{skipped_note(settings.backends)}")
    return choices


def _plan(ki: KernelInputs, active: Sequence[Template], settings: Settings, started: float) -> "_Plan":
    strategy_used, options = _strategy(ki, active, settings)
    deadline = started + settings.budget_s if settings.budget_s else None
    return _Plan(strategy_used, options, deadline, isolation_for(settings.isolation, ki.device_type))


def _facts(outcome: "_Outcome", strategy: str, compiled: CompileResult, memory: "_Memory") -> dict[str, Any]:
    """What a searched Selection reports beyond its winner and timings."""
    bench = outcome.bench
    return dict(
        strategy=strategy if bench.runnable > 1 else "pinned", benchmark_runs=bench.runs, compile_s=compiled.seconds,
        benchmark_s=bench.seconds.get("final", 0.0) + bench.seconds.get("finalist", 0.0),
        prescreen_s=bench.seconds.get("prescreen", 0.0), from_store=len(memory.known), stale_entries=memory.stale,
        binary_seconds=dict(compiled.binary_seconds), isolation=bench.isolation, overlapped=outcome.overlapped,
        noisy=outcome.decision.noisy, provisional=outcome.decision.provisional, background_load=outcome.background_load,
        budget_exhausted=bench.budget_exhausted or any(v.startswith("BudgetExceeded") for v in compiled.failures.values()))


@dataclass(frozen=True)
class _Plan:
    """How to search: the strategy actually used, its options, the time budget and the resolved isolation."""

    strategy: str
    options: StrategyOptions
    deadline: float | None
    isolation: str  # "subprocess" or "off" (isolation_for has resolved "auto")


@dataclass(frozen=True)
class _Outcome:
    """What measuring found: the final's decision and the Bench that holds the records, runs and times."""

    decision: Decision
    bench: Bench
    overlapped: bool  # timing began while binaries were still compiling
    background_load: float | None = None  # CPU: cores other processes used while the choices were timed


def _measure_and_pick(ctx: "_Context", compiled: CompileResult, choices: Sequence[Choice], memory: "_Memory",
                      plan: _Plan) -> _Outcome:
    ki, settings = ctx.ki, ctx.settings
    runnable = [c for c in choices if c in memory.runnable or compiled.may_run(c)]
    if not runnable:
        raise NoCandidatesError(f"{ki.describe()}: every candidate failed to compile: "
                                + "; ".join(sorted(set(compiled.failures.values())))[:500])
    runner = runner_for(plan.isolation, settings, ki, ctx.tensors, ctx.templates, ctx.out_layout, ctx.ensure_compiled)
    if runner.isolation == "off" and isinstance(compiled, CompileJob) and settings.overlap_compile == "auto":
        compiled.finish()  # measuring in this process after all: no timing next to the compile threads
    overlapped = isinstance(compiled, CompileJob) and compiled.running
    log.info("gemmtune: %s: searching with %s over %d runnable choices", ki.describe(), plan.strategy, len(runnable))
    with Bench(ki, runner, compiled, known=memory.known, check_correctness=settings.check_correctness,
               listener=ctx.emit, runnable=len(runnable), deadline=plan.deadline) as bench:
        decision = _search(bench, runnable, settings.with_(strategy=plan.strategy), plan.options, memory, plan.deadline)
    busy = load.background_cores(runner)  # timed while other processes held the cores: times may read high
    decision = replace(decision, provisional=True) if load.loaded_here(busy) else decision
    return _Outcome(decision, bench, overlapped, busy)


# -- the steps ------------------------------------------------------------------------------

def _search(bench: Bench, runnable: Sequence[Choice], settings: Settings, options: StrategyOptions,
            memory: "_Memory", deadline: float | None) -> Decision:
    if deadline is not None:  # under a time budget the library kernels, the safety net, are timed first
        bench.measure([c for c in runnable if c.is_extern], "final")
    if len(runnable) == 1:  # pinned (lookup table or hook): nothing to search
        bench.verify(runnable[0])
        return Decision(runnable[0])
    ranked = STRATEGIES[settings.strategy].search(runnable, bench.measure, options)  # pruned before compiling
    # The final's re-time would end past the deadline: the ranking stands (a budget is a promise).
    out_of_time = bench.time_left() < _retime_s(settings, bench.ki.device_type)
    # A provisional stored pick (decided under heavy noise) does not stand unchecked: the final re-times.
    return final_decision(ranked, bench.records, bench.retime, FinalRule.of(settings), describe=bench.ki.describe(),
                          budget_exhausted=bench.budget_exhausted or out_of_time,
                          stored_pick=None if memory.provisional else memory.pick)


def _retime_s(settings: Settings, device_type: str) -> float:
    """About how long the final's interleaved re-time takes: each finalist's timing budget, a quarter more.

    Example:
        >>> _retime_s(Settings(cpu_rep_ms=40.0, finalists=3), "cpu")
        0.2
    """
    rep_ms = settings.gpu_rep_ms if device_type == "cuda" else settings.cpu_rep_ms
    return (settings.finalists + 1) * rep_ms * 1.25e-3


def _compile_deadline(deadline: float | None, settings: Settings, device_type: str) -> float | None:
    """Compiles stop early for the library kernels (the safety net) timed after them: 10% of the budget, on CPU 30%."""
    share = 0.3 if device_type == "cpu" else 0.1
    return None if deadline is None or settings.budget_s is None else deadline - share * settings.budget_s


def fit_budget(settings: Settings) -> Settings:
    """Under a time budget, a CPU timing budget per choice of at most 2% of it (choices and finalists).

    Example:
        >>> fit_budget(Settings(budget_s=1.0)).cpu_rep_ms, fit_budget(Settings()).cpu_rep_ms
        (20.0, 50.0)
    """
    if settings.budget_s is None or settings.cpu_rep_ms <= settings.budget_s * 20.0:
        return settings
    return settings.with_(cpu_rep_ms=settings.budget_s * 20.0)


def _require_work(ki: KernelInputs) -> None:
    dims = {"M": ki.M, "N": ki.N, "K": ki.K, "batch": ki.batch}
    empty = [f"{k}={v}" for k, v in dims.items() if v == 0]
    if empty:
        raise InputError(f"{ki.describe()}: nothing to tune, {', '.join(empty)} (the product is empty or all bias)")


def _check_out_layout(ki: KernelInputs, choices: Sequence[Choice], out_layout: str | None):
    layout = choices[0].layout
    if out_layout == "col" and isinstance(layout, FixedLayout):
        generated = sorted({c.template_uid for c in choices if not c.is_extern})
        raise LayoutError(f"{ki.describe()}: out_layout='col' cannot be honoured: generated templates "
                          f"({', '.join(generated)}) are candidates, so the output layout was fixed row-major "
                          f"before code generation; use backends=('extern',) to keep it flexible")
    return layout


def _strategy(ki: KernelInputs, templates: Sequence[Template], settings: Settings) -> tuple[str, StrategyOptions]:
    """The registered strategy that runs here (see `for_device`) and its options for this problem."""
    cpu = ki.device_type == "cpu"  # on CPU: fewer numba tiles, and stage 2 only for binaries that can still win
    options = StrategyOptions(top_x=settings.top_x, stage1=_stage1(templates, settings), stage0_n=settings.stage0_n,
                              problem=ProblemDims(ki.M, ki.N, ki.K, ki.batch, ki.dtype.itemsize),
                              budget_runs=settings.budget_runs, device_type=ki.device_type, stage2_within=CPU_CANNOT_WIN
                              if cpu else None, configs_per_template=settings.cpu_configs if cpu else None)
    return for_device(settings.strategy, ki.device_type), options


def _stage1(templates: Sequence[Template], settings: Settings) -> dict[str, dict[str, Any]]:
    return {t.uid: dict(t.default_runtime if settings.stage1_runtime is None else settings.stage1_runtime)
            for t in templates}


def _timings(choices: Sequence[Choice], compiled: CompileResult, bench: Bench) -> tuple[Timing, ...]:
    rows = []
    for c in choices:
        if c in bench.records:
            rows.append(bench.records[c])
        elif c.binary_key in compiled.failures:
            rows.append(Timing(c, None, "compile", "compile_failed", compiled.failures[c.binary_key]))
        else:
            rows.append(Timing(c, None, "skipped", "not_benchmarked"))
    return tuple(sorted(rows, key=lambda t: (t.ms is None, t.ms or 0.0)))


def _kernel(ki: KernelInputs, winner: Choice, launch, out_layout: str | None) -> Callable[..., torch.Tensor]:
    rt = winner.runtime_dict

    def kernel(*tensors: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None and out_layout == "col":
            out = empty_output(ki.out_size, ki.dtype, ki.device, "col")
        return launch(tensors, out, **rt)

    if hasattr(launch, "bound") and out_layout != "col":  # the eager dispatch binds it (dispatch/binding.py)
        setattr(kernel, "bound", lambda *tensors: launch.bound(tensors, **rt))
    return kernel


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine() or "cpu"


def shared_store(location: str | None) -> Store:
    """One Store per location per process; "off" gives a fresh, empty one every time."""
    if location == "off":
        return Store(":memory:")
    key = location or "default"
    if key not in _STORES:
        _STORES[key] = open_store(location)
    return _STORES[key]


def _later_run(mark: str | None) -> bool:
    """A provisional mark ("run@written") left by a run that ended before this one began: re-check it.
    Processes running alongside the one that wrote it serve its pick, so racing processes agree.

    Example:
        >>> _later_run(None), _later_run(f"{RUN_ID}@0"), _later_run("1-0@0"), _later_run(f"1-0@{time.time() + 9}")
        (False, False, True, False)
    """
    if mark is None:
        return False
    run, _, written = mark.partition("@")
    return run != RUN_ID and float(written or 0.0) < RUN_STARTED


def _row(choice: Choice, ms: float | None, status: str, stage: str | None) -> Row:
    return Row(choice.template_uid, choice.src_hash, canon(choice.config), canon(choice.runtime), ms, status, stage)


@dataclass
class _Memory:
    """What the store knew about this problem's current choices."""

    known: dict[Choice, Timing]
    pick: Choice | None
    stale: int
    covered: set[Choice]  # choices the stored search decided about without timing them (pruned)
    stored_pick: Row | None = None  # the pick row the store held (usable or not): a re-tune replaces only it
    provisional: bool = False  # the stored pick was decided under heavy noise: re-time its finalists

    @property
    def runnable(self) -> set[Choice]:
        return {c for c, t in self.known.items() if t.status == "ok"}

    def full_hit(self, choices: Sequence[Choice], exhaustive: bool) -> bool:
        """Every choice was timed before, or (unless an exhaustive search is asked for) pruned by it."""
        covered = set() if exhaustive else self.covered
        return self.pick is not None and not self.provisional and all(c in self.known or c in covered for c in choices)

    def unknown(self, choices: Sequence[Choice]) -> list[Choice]:
        """The choices to compile and search: not timed before (nor, re-checking a provisional pick, pruned)."""
        return [c for c in choices if c not in self.known and not (self.provisional and c in self.covered)]


@dataclass
class _Context:
    ki: KernelInputs
    tensors: tuple
    settings: Settings
    templates: dict[str, Template]
    emit: Listener
    out_layout: str | None
    store: Store
    store_tag: str | None = None

    def __post_init__(self) -> None:
        self.info = env_info(self.ki.device)
        self.env = env_key(self.info)
        self.problem = f"{self.ki.problem_key}|out={self.out_layout or 'row'}"
        if self.store_tag:
            self.problem += f"|{self.store_tag}"
        self.launchers = self._launchers(CompileResult())

    def _launchers(self, compiled: CompileResult) -> Launchers:
        return Launchers(self.templates, self.ki, self.tensors, timeout_s=self.settings.compile_timeout_s,
                         compiled=compiled)

    @property
    def compiled(self) -> CompileResult:
        return self.launchers.compiled

    def compile(self, choices: Sequence[Choice], deadline: float | None = None, overlap: bool = False) -> CompileResult:
        """Compile `choices`' binaries; with `overlap` return at once (a CompileJob still running)."""
        log.info("gemmtune: %s: compiling %d binaries for %d choices", self.ki.describe(), len({c.binary_key for c in choices}), len(choices))
        workers = self.settings.compile_workers
        if overlap and not workers:  # leave a core to the process timing the first binaries
            workers = max(1, min(32, os.cpu_count() or 1) - 1)
        job = CompileJob(choices, self.templates, self.ki, self.tensors, timeout_s=self.settings.compile_timeout_s,
                         workers=workers, on_done=lambda done, total: self.emit("compile", done=done, total=total),
                         deadline=deadline)
        self.launchers = self._launchers(job if overlap else job.finish())
        log.info("gemmtune: %s: compile %s", self.ki.describe(), "continues while timing" if overlap else f"done in {self.compiled.seconds:.3f} s ({len(self.compiled.failures)} failed)")
        return self.compiled

    def ensure_compiled(self, choice: Choice):
        """The launcher of `choice`, compiling it now if it was skipped (its timing came from the store)."""
        return self.launchers(choice)

    def recall(self, choices: Sequence[Choice]) -> _Memory:
        stored = self.store.load(self.env, self.problem)
        by_key = {(c.template_uid, canon(c.config), canon(c.runtime)): c for c in choices}
        known: dict[Choice, Timing] = {}
        covered: set[Choice] = set()
        stale = 0
        for row in stored.rows:
            c = by_key.get(row.choice_key)
            if c is None:
                continue
            if row.src_hash != c.src_hash:
                stale += 1
                continue
            if row.status == "not_benchmarked":
                covered.add(c)
            else:
                known[c] = Timing(c, row.ms, "store", row.status, "from the store")
        pick = by_key.get(stored.pick.choice_key) if stored.pick else None
        if pick is not None and stored.pick is not None and (pick.src_hash != stored.pick.src_hash or pick not in known):
            pick = None
        if stale:
            log.warning("gemmtune: %s: ignored %d stored timings measured with an older template source",
                        self.ki.describe(), stale)
        return _Memory(known, pick, stale, covered, stored.pick,
                       pick is not None and _later_run(stored.provisional))

    def from_store(self, choices: Sequence[Choice], memory: _Memory, layout, started: float) -> Selection | None:
        """A full hit: no search; only the stored winner is compiled."""
        winner = memory.pick
        assert winner is not None  # a full hit has a usable stored pick
        try:
            self.ensure_compiled(winner)  # compiled now: an unusable pick is found before the Selection
        except NoCandidatesError as exc:
            log.warning("gemmtune: stored pick unusable, tuning again: %s", exc)
            return None
        run = lambda: _kernel(self.ki, winner, self.launchers(winner), self.out_layout)(*self.tensors)  # noqa: E731
        why = first_use_fault(self.store, self.env, self.problem, _row(winner, None, "ok", None), run, self.ki, self.tensors)
        if why is not None:  # a shared store's pick that computes something else: dropped, tuned again
            memory.known[winner], memory.pick = Timing(winner, None, "check", "wrong_result", why), None
            return None
        self.emit("compile", done=1, total=1)
        log.info("gemmtune: %s: cache hit: %s from the store, nothing timed", self.ki.describe(), winner.key)
        timings = tuple(sorted((memory.known.get(c) or Timing(c, None, "skipped", "not_benchmarked") for c in choices),
                               key=lambda t: (t.ms is None, t.ms or 0.0)))
        return self.selection(winner, timings, layout, started, strategy="store", benchmark_runs=0,
                              compile_s=self.compiled.seconds, benchmark_s=0.0, prescreen_s=0.0, cache_hit=True,
                              from_store=len(memory.known), stale_entries=0)

    def selection(self, winner: Choice, timings: tuple[Timing, ...], layout: Any, started: float,
                  **facts: Any) -> Selection:
        """The one place a Selection is assembled (a search's outcome, or a store hit)."""
        launch = self.ensure_compiled(winner)
        return Selection(problem=self.ki, winner=winner, timings=timings, layout=layout,
                         tuning_s=time.perf_counter() - started, device_name=device_name(self.ki.device),
                         kernel=_kernel(self.ki, winner, launch, self.out_layout), out_layout=self.out_layout or "row",
                         **facts)

    def remember(self, choices: Sequence[Choice], bench: Bench, compiled: CompileResult, decision: Decision,
                 replace: "bool | Row") -> Choice:
        """Write new timings and the pick (marked provisional if so decided); return the stored pick
        (another process may have won the race)."""
        winner = decision.choice
        rows = [_row(c, t.ms, t.status, t.stage) for c, t in bench.records.items() if t.stage != "store"]
        budget_cut = {k for k, v in compiled.failures.items() if v.startswith("BudgetExceeded")}
        rows += [_row(c, None, "compile_failed", "compile") for c in choices
                 if c.binary_key in compiled.failures and c.binary_key not in budget_cut and c not in bench.records]
        if not bench.budget_exhausted and not budget_cut:  # a cut-short search decided nothing about the rest
            rows += [_row(c, None, "not_benchmarked", "skipped") for c in choices
                     if c.binary_key not in compiled.failures and c not in bench.records]
        ms = bench.records[winner].ms if winner in bench.records else None
        stored = self.store.save(self.env, self.info, self.problem, self.ki.describe(), rows,
                                 _row(winner, ms, "ok", self.settings.strategy), replace_pick=replace,
                                 provisional=f"{RUN_ID}@{time.time()}" if decision.provisional else None)
        if stored.choice_key == _row(winner, ms, "ok", None).choice_key:
            return winner
        by_key = {(c.template_uid, canon(c.config), canon(c.runtime)): c for c in choices}
        other = by_key.get(stored.choice_key)
        return other if other is not None and other.src_hash == stored.src_hash else winner
