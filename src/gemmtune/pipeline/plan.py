"""`plan_for(settings, problem, templates) -> Plan`: every decision a tune takes from its Settings, made once.

A Plan is frozen and is the only thing the pipeline (`gemmtune.pipeline.steps`) reads: the strategy
object that runs and its options, the final's rule, one Budget (runs and seconds, with the compile
and re-time deadlines), the runner choice (isolation and compile overlap) and the store key.  The
measuring layer keeps the timer's own settings (`Plan.runner.settings`: gemmtune.measure.timers).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..core.errors import LayoutError
from ..core.inputs import KernelInputs
from ..core.settings import CPU_CANNOT_WIN, DEFAULTS, Settings, isolation_for
from ..measure.budget import Budget
from ..measure.compile import overlap_for
from ..measure.floor import Work
from ..search import STRATEGIES, Options, ProblemDims, Strategy, for_device
from ..search.final import FinalRule
from ..store.memory import StoreKey
from ..store.trust import Trust
from ..templates import active_templates
from ..templates.base import Template


@dataclass(frozen=True)
class RunnerChoice:
    """Where checks and timings run: `isolation` ("subprocess", "off"; "replay" offline), whether it
    was asked for explicitly (`required`: no fall-back to this process), and the compile-overlap mode.
    `settings` are handed to the measuring layer (timers and the worker read their own fields)."""

    isolation: str
    required: bool = False
    overlap: str = "auto"
    settings: Any = field(default=None, compare=False)

    def overlaps(self, isolation: str, device_type: str) -> bool:
        """Whether timing starts while binaries compile, for the runner actually opened (its `isolation`).

        Example:
            >>> RunnerChoice("subprocess").overlaps("subprocess", "cuda"), RunnerChoice("subprocess").overlaps("off", "cuda")
            (True, False)
        """
        return overlap_for(self.overlap, isolation, device_type)


@dataclass(frozen=True)
class CompilePlan:
    """How binaries are built: per-binary timeout and worker threads (0: one per core, at most 32)."""

    timeout_s: float = 120.0
    workers: int = 0

    def workers_for(self, overlap: bool) -> int:
        """Overlapping, a core is left to the process timing the first binaries."""
        if overlap and not self.workers:
            return max(1, min(32, os.cpu_count() or 1) - 1)
        return self.workers


@dataclass(frozen=True)
class Plan:
    """How one problem is tuned.  `name`: what `Selection.strategy` reports; `asked`: the strategy
    asked for (kept with the pick); `strategy` and `options`: what actually runs.

    Example:
        >>> import torch
        >>> ki = KernelInputs.from_tensors("mm", torch.randn(8, 4), torch.randn(4, 6))
        >>> p = plan_for(Settings(budget_s=2.0), ki)
        >>> p.name, p.strategy.name, p.budget.seconds, p.runner.isolation, p.final.launch_aware
        ('prescreen', 'prescreen', 2.0, 'off', True)
    """

    name: str
    asked: str
    strategy: Strategy
    options: Options
    final: FinalRule
    budget: Budget
    runner: RunnerChoice
    key: StoreKey = StoreKey("", {}, "", "")  # a replay keeps nothing
    templates: tuple[Template, ...] = ()
    compile: CompilePlan = CompilePlan()
    check_correctness: bool = True
    lookup_table: str | None = None
    backends: tuple[str, ...] | None = None
    store: str | None = None
    distributed: tuple[str, float] = ("off", 600.0)
    share_kernels: bool = False  # the pick's compiled kernels kept in the store too (store.kernels)
    trust: Trust = Trust()  # what the store is read under: its key, and whether it counts as shared
    work: Work | None = None  # CPU: the problem's FLOPs and bytes, whose floor a library reading is held to

    def __post_init__(self) -> None:
        self.strategy.check(self.options)  # a strategy runs with its own options type only

    @property
    def exhaustive(self) -> bool:
        """An exhaustive search was asked for: choices an earlier search pruned are timed too."""
        return self.asked == "exhaustive"


def fit_budget(settings: Settings) -> Settings:
    """Under a time budget, a CPU timing budget per choice of at most 2% of it (choices and finalists).

    Example:
        >>> fit_budget(Settings(budget_s=1.0)).cpu_rep_ms, fit_budget(Settings()).cpu_rep_ms
        (20.0, 50.0)
    """
    if settings.budget_s is None or settings.cpu_rep_ms <= settings.budget_s * 20.0:
        return settings
    return settings.with_(cpu_rep_ms=settings.budget_s * 20.0)


def final_rule(settings: Settings) -> FinalRule:
    """The final's rule of `settings`.

    Example:
        >>> final_rule(Settings(finalists=2)) == FinalRule(finalists=2, rounds=15, library_margin=0.01, launch_aware=True)
        True
    """
    return FinalRule(settings.finalists, settings.finalist_rounds, settings.library_margin, settings.noise_limit,
                     settings.launch_aware_final, settings.library_final, settings.second_timer_band)


@functools.lru_cache(maxsize=1)
def template_stage1() -> Mapping[str, Mapping[str, Any]]:
    """Each shipped template's stage-1 runtime values, by uid (usable here or not: a replay of recorded
    timings needs the values `tune` would use on the machine that recorded them)."""
    from ..templates.registry import default_templates, optional_templates

    from ..templates.padded import PREFIX

    shipped = [*default_templates(), *optional_templates()]
    stage1 = {t.uid: dict(t.default_runtime) for t in shipped if t.default_runtime}
    return {**stage1, **{PREFIX + uid: values for uid, values in stage1.items()}}  # a padded twin's: its template's


def default_options(problem: ProblemDims | None = None, strategy: str | None = None) -> Options:
    """The options `strategy` (None: the default effort's, model_pruned) runs with at the default
    effort: its "default" preset (`Strategy.efforts`), each template's stage-1 values, `problem`.

    Example:
        >>> opts = default_options()
        >>> type(opts).__name__, opts.stage1["triton_mm"], opts.top_x, opts.stage0_n
        ('ModelPrunedOptions', {'swizzle': 8}, 4, 14)
        >>> default_options(strategy="exhaustive")
        ExhaustiveOptions()
    """
    chosen = STRATEGIES[strategy or DEFAULTS["strategy"]]
    return chosen.options.from_values({**chosen.efforts.get("default", {}), "stage1": template_stage1(),
                                       "problem": problem})


def default_final() -> FinalRule:
    """The final's rule of the default effort."""
    return final_rule(Settings())


def strategy_options(settings: Settings, ki: KernelInputs, templates: Sequence[Template]) -> tuple[str, Options]:
    """The registered strategy that runs here and its options.  "default" is the default effort's
    strategy and options (its "default" preset); "budgeted" is "default" under the budget of runs
    (the Budget enforces it)."""
    cpu = ki.device_type == "cpu"  # on CPU: fewer numba tiles, and stage 2 only for binaries that can still win
    alias = settings.strategy in ("default", "budgeted")
    name = for_device(DEFAULTS["strategy"] if alias else settings.strategy, ki.device_type)
    stage1 = {t.uid: dict(t.default_runtime if settings.stage1_runtime is None else settings.stage1_runtime)
              for t in templates}
    values = {"top_x": settings.top_x, "stage0_n": settings.stage0_n, "stage1": stage1,
              "problem": ProblemDims(ki.M, ki.N, ki.K, ki.batch, ki.dtype.itemsize),
              "stage2_within": CPU_CANNOT_WIN if cpu else None,
              "configs_per_template": settings.cpu_configs if cpu else None}
    chosen = STRATEGIES[name]
    if alias:
        values.update(chosen.efforts.get("default", {}))
    return name, chosen.options.from_values(values)


def plan_for(settings: Settings, problem: KernelInputs, templates: Sequence[Template] | None = None, *,
             started: float = 0.0, out_layout: str | None = None, store_tag: str | None = None) -> Plan:
    """The Plan of tuning `problem` under `settings`: `templates` (None: the registry's) filtered to
    those of `settings.backends` that run it (the library's alone where `out_layout` "padded" pads N's
    rows); `started` (a `time.perf_counter()` value) starts the budget."""
    settings = fit_budget(settings)
    device = problem.device_type
    active = active_templates(problem, settings.backends, templates, settings.hopper_templates,
                              settings.config_space, settings.preview_templates)
    if out_layout == "padded":  # as `core.layout.effective_layout` gives it: N's rows need the padding
        active = [t for t in active if t.writes_padded_rows]  # rows of a padded stride: the library's kernels
        if not active:
            raise LayoutError(f"{problem.describe()}: out_layout='padded' pads N's rows, which only the library's "
                              f"kernels write; backends={settings.backends} offers none")
    name, options = strategy_options(settings, problem, active)
    rep_ms = settings.gpu_rep_ms if device == "cuda" else settings.cpu_rep_ms
    budget = Budget(runs=settings.budget_runs, seconds=settings.budget_s, started=started,
                    compile_share=0.3 if device == "cpu" else 0.1,
                    retime_s=(settings.finalists + 1) * rep_ms * 1.25e-3)
    runner = RunnerChoice(isolation_for(settings.isolation, device), settings.isolation == "subprocess",
                          settings.overlap_compile, settings)
    return Plan(for_device(settings.strategy, device), settings.strategy, STRATEGIES[name], options,
                final_rule(settings), budget, runner, StoreKey.of(problem, out_layout, store_tag), tuple(active),
                CompilePlan(settings.compile_timeout_s, settings.compile_workers), settings.check_correctness,
                settings.lookup_table, settings.backends, settings.store,
                (settings.distributed, settings.distributed_timeout_s), settings.share_kernels,
                Trust.of(settings), Work.of(problem) if device == "cpu" else None)


def replay_plan(strategy: str, options: Options, final: FinalRule | None = None,
                runs: int | None = None) -> Plan:
    """The Plan of an offline replay: a registered strategy with its options, nothing kept, recorded times."""
    return Plan(strategy, strategy, STRATEGIES[strategy], options, final or default_final(), Budget(runs=runs),
                RunnerChoice("replay", overlap="off"))


__all__ = ["Plan", "RunnerChoice", "CompilePlan", "plan_for", "strategy_options", "fit_budget", "final_rule",
           "default_options", "default_final", "template_stage1", "replay_plan"]
