"""The store's policy for one tune, behind a typed key: what a tune may trust, and how its outcome is kept.

`recall(store, key, choices)` reads the problem's stored rows and decides:

- a row whose template `src_hash` differs from the template's current one is stale: ignored (and
  counted, and logged), re-measured when a search needs it;
- a `not_benchmarked` row (a choice an earlier search pruned) counts as decided, so that a second
  tune of the same problem is a full hit, unless an exhaustive search is asked for;
- a pick marked provisional (decided under heavy noise) is re-checked (its finalists re-timed) only
  by a later run (begun after the mark was written) that holds the store alone (below); every other
  process serves it as stored.

A shared store's answers are checked before they decide or run (`store.checked`, `Memory.check`):
an entry found wrong is dropped from the store (`Memory.reject`) and the problem decided again; after
`WRONG_LIMIT` wrong entries of one problem no stored timing of it is trusted in this tune.

**One answer per problem.** Processes (and ranks) sharing a store run the same pick for a problem:

1. a process runs the pick the store holds when it asks, as stored, provisional or not (a hit), or
   the pick the store holds after its own tune's write (`Memory.remember`): a first pick is
   insert-if-absent, so of racing processes the first writer's pick is every process's;
2. a pick other processes may be running (usable here: current source, its row ok, or a pick of
   another candidate pool) is written over only by a process that holds the store alone, inside
   `Presence.exclusive` (`store.presence`: SQLite files; a Redis store is never held alone, so its
   picks change only by rule 3).  A process that re-checked a provisional pick, or decided otherwise
   on a partial hit, while others hold the store keeps the stored pick (its rows are written);
3. a pick that cannot run anywhere is replaced by whoever finds it: a stale one (its template's source
   changed), one without its timing row, and one that failed the correctness gate (dropped first;
   every process checks a shared store's pick before it runs it, so none runs a wrong one).

So a pick changes only while no other process runs it, or when no process can run it.
`distributed` ranks take the owner's stored pick (rule 1).  Nothing outside store/ knows rows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping, Sequence

from ..core.choices import Choice, Timing
from ..core.inputs import KernelInputs
from .checked import checked_here, drop, gate
from .keys import Row, canon, env_info, env_key
from .rows import pick_row, to_row, to_timing

log = logging.getLogger("gemmtune")
RUN_STARTED = time.time()
RUN_ID = f"{os.getpid()}-{RUN_STARTED:.0f}"  # this process: a provisional pick is re-checked by a later run only
WRONG_LIMIT = 2  # stored entries of one problem found wrong, after which none of its stored timings is trusted


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
    """A provisional mark ("run@written") written before this run began: it may be re-checked (by a
    process holding the store alone, `recall`).  Processes running alongside the one that wrote it serve it.

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


def alone(store: Any) -> ContextManager[bool]:
    """Within the block, whether this process holds `store` alone (no other process can be running its
    picks): a SQLite file's `Presence.exclusive`; a store in this process's memory always; never a
    store without a presence (Redis, a file whose lock could not be taken).

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> with alone(Store(":memory:")) as mine:
        ...     mine
        True
    """
    presence = getattr(store, "presence", None)
    if presence is not None:
        return presence.exclusive()
    return contextlib.nullcontext(getattr(store, "path", None) == ":memory:")


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
    in_use: bool = False  # the stored pick is one other processes may run: written over only alone
    wrong: int = 0  # this problem's stored entries found wrong in this process

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

    # -- the correctness gate on what the store answered (`store.checked`) --------------------
    def needs_check(self, choice: Choice) -> bool:
        """Whether `choice`, answered by this store, must pass the gate before it decides or runs here
        (a shared store's, not yet checked in this process)."""
        return not checked_here(self.store, self.key.env, self.key.problem, pick_row(choice))

    def check(self, choice: Choice, fault: Callable[[], str | None]) -> str | None:
        """`store.checked.gate` on `choice` (`fault()` runs and checks it): None when it may run; else
        why not, after it was dropped from the store and recorded wrong for this tune."""
        why = gate(self.store, self.key.env, self.key.problem, pick_row(choice), fault, self.key.describe)
        if why is not None:
            self._wrong(choice, why)
        return why

    def reject(self, choice: Choice, why: str) -> None:
        """A stored entry the tune found wrong (any store): dropped from the store with a warning."""
        drop(self.store, self.key.env, self.key.problem, pick_row(choice), why, self.key.describe)
        self._wrong(choice, why)

    @property
    def distrusted(self) -> bool:
        """`WRONG_LIMIT` stored entries of this problem were wrong: no stored timing of it is trusted."""
        return self.wrong >= WRONG_LIMIT

    def _wrong(self, choice: Choice, why: str) -> None:
        self.known[choice] = Timing(choice, None, "check", "wrong_result", why)
        if self.pick == choice:
            self.pick = None
        self.in_use = False  # the drop took the problem's pick with it: nothing left to keep
        self.wrong += 1

    def remember(self, choices: Sequence[Choice], records: Mapping[Choice, Timing], failures: Mapping[tuple, str],
                 winner: Choice, *, strategy: str, provisional: bool, cut_short: bool,
                 check: Callable[[Choice], str | None] | None = None) -> Choice:
        """Write new timings and the pick (marked provisional if so decided); return the pick to run:
        the one the store holds afterwards (another process may have won the race, or hold a pick in
        use: the module docstring's rules), checked first where it came from a shared store (`check(c)`
        runs `c` and says what is wrong with it).  `cut_short`: a budget stopped the search, so it
        decided nothing about the choices it did not reach (no `not_benchmarked` rows for them)."""
        rows = [to_row(t) for t in records.values() if t.stage != "store"]
        budget_cut = {k for k, v in failures.items() if v.startswith("BudgetExceeded")}
        rows += [to_row(Timing(c, None, "compile", "compile_failed")) for c in choices
                 if c.binary_key in failures and c.binary_key not in budget_cut and c not in records]
        if not cut_short and not budget_cut:
            rows += [to_row(Timing(c, None, "skipped", "not_benchmarked")) for c in choices
                     if c.binary_key not in failures and c not in records]
        self._drop_contradicted(records)
        pick = pick_row(winner, records[winner].ms if winner in records else None, strategy)
        mark = f"{RUN_ID}@{time.time()}" if provisional else None
        stored = self._write(rows, pick, mark)
        for _ in range(WRONG_LIMIT):
            other = _by_key(choices).get(stored.choice_key)
            if stored.choice_key == pick.choice_key or other is None or other.src_hash != stored.src_hash:
                return winner  # ours (or another candidate pool's pick, which cannot run here)
            mine = records.get(other)
            if mine is not None and mine.stage != "store":  # measured in this tune
                if mine.status != "wrong_result":
                    return other if mine.status == "ok" else winner
                self.reject(other, mine.detail or "wrong result")
            elif check is None or self.check(other, lambda: check(other)) is None:
                return other
            stored = self._write([], pick, mark)  # the wrong pick was dropped: ours goes in
        return winner

    def _write(self, rows: list[Row], pick: Row, mark: str | None) -> Row:
        """One save: over a pick other processes may run only while this one holds the store alone."""
        args = (self.key.env, dict(self.key.info), self.key.problem, self.key.describe, rows, pick)
        with (alone(self.store) if self.in_use else contextlib.nullcontext(True)) as mine:
            # compare-and-set over the pick read (a re-tune replaces only it); else insert-if-absent
            return self.store.save(*args, replace_pick=(self.stored_pick or False) if mine else False,
                                   provisional=mark)

    def _drop_contradicted(self, records: Mapping[Choice, Timing]) -> None:
        """A stored ok timing whose choice this tune measured wrong is dropped (the rows written after
        it would not replace it: same-source rows already there win)."""
        for c, t in records.items():
            was = self.known.get(c)
            if t.stage != "store" and t.status == "wrong_result" and was is not None and was.status == "ok":
                self.reject(c, t.detail or "wrong result")


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
    foreign = stored.pick is not None and pick is None  # another candidate pool's pick: others may run it
    if pick is not None and stored.pick is not None and (pick.src_hash != stored.pick.src_hash or pick not in known
                                                         or known[pick].status != "ok"):
        pick = None  # stale, or without its ok row: it cannot run anywhere, whoever finds it replaces it
    if stale:
        log.warning("gemmtune: %s: ignored %d stored timings measured with an older template source",
                    key.describe, stale)
    return Memory(store, key, known, pick, stale, covered, stored.pick, _recheck(store, pick, stored.provisional),
                  in_use=foreign or pick is not None)


def _recheck(store: Any, pick: Choice | None, mark: str | None) -> bool:
    """Re-check a provisional pick: a later run's, holding the store alone (else served as stored)."""
    if pick is None or not later_run(mark):
        return False
    with alone(store) as mine:
        return mine
