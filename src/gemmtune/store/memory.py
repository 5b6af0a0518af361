"""The store's policy for one tune, behind a typed key: what a tune may trust, and how its outcome is kept.

`recall(store, key, choices)` reads the problem's stored rows and decides:

- a row whose template `src_hash` differs from the template's current one is stale: ignored (and
  counted, and logged), re-measured when a search needs it;
- a `not_benchmarked` row (a choice an earlier search pruned) counts as decided, so that a second
  tune of the same problem is a full hit, unless an exhaustive search is asked for;
- a pick marked provisional (decided under heavy noise) by a run that ended before this one began is
  re-checked: its finalists are re-timed.  Processes running alongside the one that wrote it serve it.

`Memory.remember(...)` writes the new timings and the pick: a first pick is insert-if-absent and a
re-tune writes over only the pick it read (compare-and-set), so racing processes agree on one pick;
the pick another process stored first is the one returned.  Nothing outside store/ knows rows.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from ..core.choices import Choice, Timing
from ..core.inputs import KernelInputs
from .checked import first_use_fault
from .keys import Row, canon, env_info, env_key
from .rows import pick_row, to_row, to_timing

log = logging.getLogger("gemmtune")
RUN_STARTED = time.time()
RUN_ID = f"{os.getpid()}-{RUN_STARTED:.0f}"  # this process: a provisional pick is re-checked by a later run only


@dataclass(frozen=True)
class StoreKey:
    """Where one problem's timings and pick live: the environment (device and versions) and the problem.

    Example:
        >>> import torch
        >>> ki = KernelInputs.from_tensors("mm", torch.randn(4, 3), torch.randn(3, 2))
        >>> k = StoreKey.of(ki, "col", "traced")
        >>> k.problem.endswith("|out=col|traced"), k.describe == ki.describe()
        (True, True)
    """

    env: str
    info: Mapping[str, Any] = field(compare=False)
    problem: str
    describe: str

    @classmethod
    def of(cls, ki: KernelInputs, out_layout: str | None = None, tag: str | None = None) -> "StoreKey":
        info = env_info(ki.device)
        problem = f"{ki.problem_key}|out={out_layout or 'row'}" + (f"|{tag}" if tag else "")
        return cls(env_key(info), info, problem, ki.describe())

    def where(self) -> tuple[str, dict, str, str]:
        """(env key, env info, problem key, description): what a distributed job shares."""
        return self.env, dict(self.info), self.problem, self.describe


def later_run(mark: str | None) -> bool:
    """A provisional mark ("run@written") left by a run that ended before this one began: re-check it.
    Processes running alongside the one that wrote it serve its pick, so racing processes agree.

    Example:
        >>> later_run(None), later_run(f"{RUN_ID}@0"), later_run("1-0@0"), later_run(f"1-0@{time.time() + 9}")
        (False, False, True, False)
    """
    if mark is None:
        return False
    run, _, written = mark.partition("@")
    return run != RUN_ID and float(written or 0.0) < RUN_STARTED


def _by_key(choices: Sequence[Choice]) -> dict[tuple[str, str, str], Choice]:
    return {(c.template_uid, canon(c.config), canon(c.runtime)): c for c in choices}


@dataclass
class Memory:
    """What the store knew about this problem's current choices, and how to keep this tune's outcome."""

    store: Any
    key: StoreKey
    known: dict[Choice, Timing]
    pick: Choice | None
    stale: int
    covered: set[Choice]  # choices the stored search decided about without timing them (pruned)
    stored_pick: Row | None = None  # the pick row the store held (usable or not): a re-tune replaces only it
    provisional: bool = False  # the stored pick was decided under heavy noise: re-time its finalists

    @property
    def runnable(self) -> set[Choice]:
        return {c for c, t in self.known.items() if t.status == "ok"}

    @property
    def trusted_pick(self) -> Choice | None:
        """The stored pick a final may keep when nothing new reaches it (none while it is provisional)."""
        return None if self.provisional else self.pick

    def full_hit(self, choices: Sequence[Choice], exhaustive: bool) -> bool:
        """Every choice was timed before, or (unless an exhaustive search is asked for) pruned by it."""
        covered = set() if exhaustive else self.covered
        return self.pick is not None and not self.provisional and all(c in self.known or c in covered for c in choices)

    def unknown(self, choices: Sequence[Choice]) -> list[Choice]:
        """The choices to compile and search: not timed before (nor, re-checking a provisional pick, pruned)."""
        return [c for c in choices if c not in self.known and not (self.provisional and c in self.covered)]

    def first_use_fault(self, winner: Choice, run: Callable[[], torch.Tensor], ki: KernelInputs,
                        tensors: Sequence[torch.Tensor]) -> str | None:
        """Why the stored pick `winner` is wrong on its first use in this process (a shared store's pick
        is checked against the reference; a wrong one is dropped from the store), else None."""
        return first_use_fault(self.store, self.key.env, self.key.problem, pick_row(winner), run, ki, tensors)

    def drop_pick(self, choice: Choice, why: str) -> None:
        """The stored pick computes something else: forget it for this tune."""
        self.known[choice], self.pick = Timing(choice, None, "check", "wrong_result", why), None

    def remember(self, choices: Sequence[Choice], records: Mapping[Choice, Timing], failures: Mapping[tuple, str],
                 winner: Choice, *, strategy: str, provisional: bool, cut_short: bool) -> Choice:
        """Write new timings and the pick (marked provisional if so decided); return the stored pick
        (another process may have won the race).  `cut_short`: a budget stopped the search, so it
        decided nothing about the choices it did not reach (no `not_benchmarked` rows for them)."""
        rows = [to_row(t) for t in records.values() if t.stage != "store"]
        budget_cut = {k for k, v in failures.items() if v.startswith("BudgetExceeded")}
        rows += [to_row(Timing(c, None, "compile", "compile_failed")) for c in choices
                 if c.binary_key in failures and c.binary_key not in budget_cut and c not in records]
        if not cut_short and not budget_cut:
            rows += [to_row(Timing(c, None, "skipped", "not_benchmarked")) for c in choices
                     if c.binary_key not in failures and c not in records]
        ms = records[winner].ms if winner in records else None
        # Replace a stored pick we re-tuned over (partial hit) or could not use (stale source);
        # a first pick is insert-if-absent so that racing processes agree on one.
        stored = self.store.save(self.key.env, dict(self.key.info), self.key.problem, self.key.describe, rows,
                                 pick_row(winner, ms, strategy), replace_pick=self.stored_pick or False,
                                 provisional=f"{RUN_ID}@{time.time()}" if provisional else None)
        if stored.choice_key == pick_row(winner).choice_key:
            return winner
        other = _by_key(choices).get(stored.choice_key)
        return other if other is not None and other.src_hash == stored.src_hash else winner


def recall(store: Any, key: StoreKey, choices: Sequence[Choice]) -> Memory:
    """What `store` holds for `key` that still applies to `choices` (see the module docstring)."""
    stored = store.load(key.env, key.problem)
    by_key = _by_key(choices)
    known: dict[Choice, Timing] = {}
    covered: set[Choice] = set()
    stale = 0
    for row in stored.rows:
        c = by_key.get(row.choice_key)
        if c is None:
            continue
        if row.src_hash != c.src_hash:
            stale += 1
        elif row.status == "not_benchmarked":
            covered.add(c)
        else:
            known[c] = to_timing(row, c)
    pick = by_key.get(stored.pick.choice_key) if stored.pick else None
    if pick is not None and stored.pick is not None and (pick.src_hash != stored.pick.src_hash or pick not in known):
        pick = None
    if stale:
        log.warning("gemmtune: %s: ignored %d stored timings measured with an older template source",
                    key.describe, stale)
    return Memory(store, key, known, pick, stale, covered, stored.pick,
                  pick is not None and later_run(stored.provisional))
