"""The pipeline every tune runs, live or replayed: prune -> compile -> Bench -> search -> final.

`search(plan, choices, memory, build, open_runner)` is the middle of a tune (the store's recall
before it and its remember after it are the engine's, `gemmtune.store.memory`).  A live tune hands
it the compile of the templates and a runner that runs kernels; an offline replay
(`gemmtune.offline.replay`) hands it `ReplayCompiled` and a `ReplayRunner`: only the runner differs.

What the store answered (`Recalled`) ranks candidates without running them, but whatever wins from it
runs only after the correctness gate (`_gated`): the re-time checks the stored finalists it runs, and a
winner nothing checked in this tune is checked before it is returned.  One found wrong is dropped
from the store and the decision is made again among the rest; after two wrong entries no
stored timing of the problem is trusted and it is measured afresh (`store.memory.WRONG_LIMIT`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol, Sequence

from ..core.choices import Choice, Timing, library_reference as reference
from ..core.errors import NoCandidatesError
from ..measure import floor, load
from ..measure.bench import Bench, Listener
from ..measure.compile import CompileResult
from ..measure.runners import Runner
from ..search import ranking
from ..search.final import Decision, final_decision
from .plan import Plan

log = logging.getLogger("gemmtune")
Build = Callable[[Sequence[Choice], bool], CompileResult]
"""`build(choices, overlap) -> CompileResult`: compile the choices' binaries (overlap: return at once)."""


@dataclass(frozen=True)
class Outcome:
    """What measuring found: the final's decision, the Bench that holds the records, runs and times,
    and what was compiled."""

    decision: Decision
    ranked: list[Timing]  # the strategy's ranking the final chose from
    bench: Bench
    compiled: CompileResult
    overlapped: bool  # timing began while binaries were still compiling
    background_load: float | None = None  # CPU: cores other processes used while the choices were timed

    def timings(self, choices: Sequence[Choice]) -> tuple[Timing, ...]:
        """Every choice's timing for the Selection (compile failures and unmeasured ones too), fastest first."""
        records, failures = self.bench.records, self.compiled.failures
        rows = []
        for c in choices:
            if c in records:
                rows.append(records[c])
            elif c.binary_key in failures:
                rows.append(Timing(c, None, "compile", "compile_failed", failures[c.binary_key]))
            else:
                rows.append(Timing(c, None, "skipped", "not_benchmarked"))
        return tuple(sorted(rows, key=lambda t: (t.ms is None, t.ms or 0.0)))

    def facts(self, strategy: str, **store_facts: Any) -> dict[str, Any]:
        """What a searched Selection reports beyond its winner and timings (`store_facts`: the recall's)."""
        bench, compiled, second = self.bench, self.compiled, self.decision.second
        return dict(
            strategy=strategy if bench.runnable > 1 else "pinned", benchmark_runs=bench.runs,
            compile_s=compiled.seconds, benchmark_s=sum(bench.seconds.get(k, 0.0) for k in ("final", "finalist",
                                                                                              "second_timer")),
            prescreen_s=bench.seconds.get("prescreen", 0.0), binary_seconds=dict(compiled.binary_seconds),
            isolation=bench.isolation, overlapped=self.overlapped, noisy=self.decision.noisy,
            provisional=self.decision.provisional, background_load=self.background_load,
            budget_exhausted=self.cut_short, second_reading=second.describe() if second else None,
            decided_by=second.timer if second else None, **store_facts)

    def stored_strategy(self, strategy: str) -> str:
        """The strategy the store records with the pick, naming the second timer where one decided."""
        second = self.decision.second
        return f"{strategy}, decided by {second.timer}" if second is not None else strategy

    def log_pick(self, describe: str, winner: Choice) -> None:
        """Log the pick and the time that decided it."""
        t = self.bench.records.get(winner)
        deciding = f"{t.ms:.4f} ms, stage {t.stage}" if t is not None and t.ms is not None else "none"
        log.info("gemmtune: %s: picked %s (deciding time: %s)", describe, winner.key, deciding)

    @property
    def cut_short(self) -> bool:
        """A budget stopped the search or the compiles: it decided nothing about what it did not reach."""
        return self.bench.budget_exhausted or any(v.startswith("BudgetExceeded") for v in self.compiled.failures.values())


class Gate(Protocol):
    """The store's side of the correctness gate (`gemmtune.store.memory.Memory`)."""

    @property
    def distrusted(self) -> bool:
        """Too many of the problem's stored entries were wrong: trust none of its timings."""

    def needs_check(self, choice: Choice) -> bool:
        """`choice`, answered by the store, must pass the gate before it decides or runs."""

    def check(self, choice: Choice, fault: Callable[[], str | None]) -> str | None:
        """Gate `choice` (`fault()` runs and checks it); a wrong one is dropped from the store."""

    def reject(self, choice: Choice, why: str) -> None:
        """A stored entry found wrong: dropped from the store."""


@dataclass(frozen=True)
class Recalled:
    """What the store answered that the search uses: timings to answer without running, choices
    to compile and search, the stored pick a final may keep, and the gate on all of it (None: a
    replay's recorded times, nothing to check)."""

    known: dict[Choice, Timing]
    unknown: list[Choice]
    trusted_pick: Choice | None = None
    gate: Gate | None = None


def search(plan: Plan, choices: Sequence[Choice], recalled: Recalled, build: Build, open_runner: Callable[[], Runner],
           *, describe: str, device_type: str, listener: Listener | None = None) -> Outcome:
    """Prune, open the runner, compile (overlapping where the runner allows), measure and decide."""
    # The strategy prunes before anything compiles (model_pruned: the cost model), so a pruned
    # binary is never built; its search then sees only what compiled.
    todo = plan.strategy.prune(recalled.unknown, plan.options)
    runner = open_runner()  # opened first: whether timing may overlap the compiles depends on where it runs
    try:
        compiled = build(todo, plan.runner.overlaps(runner.isolation, device_type))
    except BaseException:
        runner.close()
        raise
    try:
        runnable = [c for c in choices if (c in recalled.known and recalled.known[c].status == "ok")
                    or compiled.may_run(c)]
        if not runnable:
            runner.close()
            raise NoCandidatesError(f"{describe}: every candidate failed to compile: "
                                    + "; ".join(sorted(set(compiled.failures.values())))[:500])
        overlapped = compiled.running
        log.info("gemmtune: %s: searching with %s over %d runnable choices", describe, plan.name, len(runnable))
        gate = recalled.gate
        with Bench(None, runner, compiled, known=recalled.known, check_correctness=plan.check_correctness,
                   listener=listener, runnable=len(runnable), budget=plan.budget, describe=describe,
                   device_type=device_type, check_recalled=gate is not None,
                   on_wrong=gate.reject if gate is not None else None) as bench:
            ranked, decision = _gated(plan, bench, runnable, recalled)
    finally:
        compiled.abandon()
    busy = load.background_cores(runner)  # timed while other processes held the cores: times may read high
    timed = {t.choice: t.ms for t in ranked if t.ms is not None and t.status == "ok"}
    library = reference(list(timed))
    not_own = load.loaded_here(busy)  # readings that are not the kernels' own times
    if not not_own and busy is not None and plan.work is not None and library is not None:  # a real CPU timer
        not_own = floor.far_above(timed[library], plan.work)
    if not_own:
        decision = busy_decision(decision, library, recalled.trusted_pick)
    return Outcome(decision, ranked, bench, compiled, overlapped, busy)


def busy_decision(decision: Decision, library: Choice | None, firm: Choice | None = None) -> Decision:
    """The decision of a tune whose CPU readings are not the kernels' own times (other processes held
    the cores, or the library kernel read far above its problem's floor, `measure.floor`): provisional,
    and never a generated kernel this tune measured (such readings do not show it beat the library
    kernel): the fastest `library` kernel the tune ranked stands in until a quiet tune decides.  The
    store's `firm` pick (an earlier tune decided it, not provisionally) and a pool with no library
    kernel keep their pick.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> lib, gen = Choice("aten_mm", None), Choice("numba_mm", "h", family="numba")
        >>> d = busy_decision(Decision(gen), lib)
        >>> d.choice.template_uid, d.provisional, busy_decision(Decision(gen), lib, firm=gen).choice == gen
        ('aten_mm', True, True)
    """
    pick = decision.choice
    if pick.is_extern or pick == firm or library is None:
        return replace(decision, provisional=True)
    log.info("gemmtune: timed under load: %s stands in for %s until a quiet tune decides", library.key, pick.key)
    return replace(decision, choice=library, provisional=True)


def _gated(plan: Plan, bench: Bench, runnable: Sequence[Choice], recalled: Recalled) -> tuple[list[Timing], Decision]:
    """`decide`, until the winner is one this tune measured or checked: a winner whose timing (or
    standing as the stored pick) came from the store is checked first; a wrong one is left out and
    the problem decided again.  Once the gate distrusts the store, its timings are dropped and what
    is left is measured afresh (so this ends: each round leaves a choice out, or measures afresh)."""
    gate, stored, left = recalled.gate, recalled.trusted_pick, list(runnable)
    while True:
        if gate is not None and gate.distrusted and bench.known:
            bench.distrust()
            stored = None
        ranked, decision = decide(plan, bench, left, stored)
        winner = decision.choice
        if gate is None or not bench.recalled(winner) or not gate.needs_check(winner):
            return ranked, decision
        known = bench.records.get(winner)
        if (known is None or known.status == "ok") and gate.check(winner, lambda: bench.check(winner)) is None:
            return ranked, decision
        left, stored = [c for c in left if c != winner], None
        if not left:
            raise NoCandidatesError(f"{bench.describe}: no candidate produced a correct result (the store's "
                                    "entries for this problem were wrong)")


def decide(plan: Plan, bench: Bench, runnable: Sequence[Choice],
           stored_pick: Choice | None) -> tuple[list[Timing], Decision]:
    """The strategy's search through `bench`, then the final over its ranking: (ranking, decision)."""
    if len(runnable) == 1:  # pinned (lookup table or hook): nothing to search
        bench.verify(runnable[0])
        return [], Decision(runnable[0])
    if plan.budget.limited:  # under a budget the library kernels, the safety net, are timed first
        bench.measure([c for c in runnable if c.is_extern], "final")
    ranked = plan.strategy.search(runnable, bench, plan.options)  # pruned before compiling; bench: its records too
    if plan.budget.runs is not None:  # what the budget let through that the strategy did not rank
        listed = {m.choice for m in ranked}
        ranked = ranking([*ranked, *(Timing(c, t.ms if t.status == "ok" else None, t.stage)
                                     for c, t in bench.records.items() if c not in listed)])
    # The final's re-time would end past the deadline: the ranking stands (a budget is a promise).
    # A provisional stored pick (decided under heavy noise) does not stand unchecked: the final re-times.
    return ranked, final_decision(ranked, bench.records, bench.retime, plan.final, describe=bench.describe,
                                  budget_exhausted=bench.budget_exhausted or not plan.budget.room_for_retime(),
                                  stored_pick=stored_pick, second=bench.second_opinion)
