"""One tune per problem across the ranks of a torch.distributed job.

When a process group is initialised with more than one rank, and `Settings.distributed` is "auto"
(the default), every new problem is tuned once in the job.  A group given to `gemmtune.tune(...,
group=pg)`, `gemmtune.warmup(..., group=pg)` or `with gemmtune.distributed_group(pg):` takes the
place of the default one: each problem is then tuned once in that group, on one of its ranks.

- **In SPMD order** (eager calls, `gemmtune.tune`, the Inductor handler's tunes): first every rank
  announces its tune, the problem's store key and a digest of its candidate pool (`pool_digest`);
  ranks that differ (two problems, one problem from other candidates, a tune made on one rank alone)
  give `DistributedTuneError` on every rank, naming each rank's problem, and nothing is stored.
  Then the problem's owner (a hash of its store key, modulo the world size) tunes it; the others
  wait.  The owner broadcasts the problem's key, stored rows and pick; every rank checks them
  (`store.rank_messages`: the key is its own, the rows well-formed), writes them into its own store,
  and builds its Selection from them as a store hit.  So every rank runs the same kernel.
- **Dealt** (`gemmtune.warmup`): inside `job.dealing()`, each rank tunes only its share of the
  problems, all at once; leaving the block all-gathers every rank's rows (each checked, and written
  under the key its sender tuned), so afterwards every rank's store answers every problem.

The exchange runs on a gloo group of its own (CPU objects, whatever the job's backend), with a
timeout (`Settings.distributed_timeout_s`).  A rank that dies or times out, or an owner whose tune
fails, gives `DistributedTuneError` naming the problem and the rank on every rank: never a hang.
`Settings(distributed="off")` tunes on every rank as before.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import threading
from typing import Any, Callable, Iterator, TypeVar

from .keys import Row
from .rank_messages import (DistributedTuneError, Payload, checked_announcements, checked_answer, checked_share,
                            disagreement, pool_digest, rows_of)

T = TypeVar("T")
_STATE = threading.local()
_GROUPS: dict[tuple, Any] = {}
_GIVEN: list[Any] = []
__all__ = ["DistributedTuneError", "distributed_group", "checked_group", "owner_of", "pool_digest", "Job", "current",
           "alone"]


@contextlib.contextmanager
def distributed_group(group: Any) -> Iterator[None]:
    """Share the tunes made inside the block over `group`, a `torch.distributed` ProcessGroup that
    this rank is a member of (None: the default group), in place of the default group.

    For the calls that take no `group=` argument: eager `gemmtune.mm`/`addmm`/`bmm`, patched layers
    and the Inductor handler's tunes.  Every rank of `group` must make the same new tunes in the same
    order (SPMD).  A `group` that is not a ProcessGroup is a TypeError.

    Example:
        >>> import gemmtune
        >>> with gemmtune.distributed_group(None):   # None: the default group, when one is initialised
        ...     pass
    """
    _GIVEN.append(checked_group(group))
    try:
        yield
    finally:
        _GIVEN.pop()


def checked_group(group: Any) -> Any:
    """`group` when it is None or a `torch.distributed` ProcessGroup; else a TypeError naming what
    was given.

    Example:
        >>> checked_group(None) is None
        True
    """
    if group is None:
        return None
    import torch.distributed as dist

    kind = getattr(dist, "ProcessGroup", None) if dist.is_available() else None
    if kind is None or not isinstance(group, kind):
        outside = isinstance(group, int) and group == getattr(dist, "GroupMember").NON_GROUP_MEMBER
        raise TypeError(f"group: expected a torch.distributed ProcessGroup that this rank is a member of (or None "
                        f"for the default group), got {type(group).__name__} {group!r:.60}"
                        + (" (what dist.new_group returns on a rank outside the group)" if outside else ""))
    return group


def owner_of(problem: str, world: int) -> int:
    """The rank that tunes `problem` (the same on every rank, in every process).

    Example:
        >>> owner_of("mm(8x4, 4x2)/float32", 4) == owner_of("mm(8x4, 4x2)/float32", 4) < 4
        True
    """
    return int(hashlib.sha256(problem.encode()).hexdigest()[:8], 16) % world


class Job:
    """This rank's view of the job: `share` for one problem in SPMD order, `dealing` for a batch."""

    def __init__(self, group: Any, timeout_s: float):
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        ranks = None if group is None else tuple(dist.get_process_group_ranks(group))
        # One exchange group per set of ranks and timeout; a given group's is created by its members only
        key = (ranks, timeout_s)
        if key not in _GROUPS:  # collective: every rank (of the given group) creates it at its first shared tune
            try:
                _GROUPS[key] = dist.new_group(None if ranks is None else list(ranks), backend="gloo",
                                              timeout=datetime.timedelta(seconds=timeout_s),
                                              use_local_synchronization=ranks is not None)
            except RuntimeError as exc:  # DistStoreError (a rank that never came) is one
                raise DistributedTuneError(f"rank {self.rank}: the ranks did not all join gemmtune's exchange group "
                                           f"within {timeout_s:g} s (a rank died?): {exc}") from exc
        self.group = _GROUPS[key]
        self.rank = dist.get_rank(self.group)  # its ranks sorted, whatever order `group` had
        self.timeout_s = timeout_s

    def _global(self, rank: int) -> int:
        return self.dist.get_global_rank(self.group, rank)

    def share(self, store: Any, where: tuple[str, dict, str, str], tune_here: Callable[[], T], pool: str = "") -> T:
        """Every rank announces its tune (`where`'s problem key and `pool`, `pool_digest`'s digest of
        its candidates) and checks that all agree; then the owner tunes (`tune_here`) and sends the
        stored rows; the others check and take them, then tune (a store hit).  `where`: (env key, env
        info, problem key, description).  While dealing: tune here and note the problem for the exchange."""
        env, info, problem, describe = where
        dealt = getattr(_STATE, "dealt", None)
        if dealt is not None:
            out = tune_here()
            dealt.append((store, where))
            return out
        self._agree(problem, pool, describe)
        owner = owner_of(problem, self.world)
        if self.rank == owner:
            try:
                out = tune_here()
            except BaseException as exc:
                self._exchange([("error", problem, f"{type(exc).__name__}: {exc}")], owner, problem)
                raise
            self._exchange([("rows", problem, rows_of(store.load(env, problem)))], owner, problem)
            return out
        [message] = self._exchange([None], owner, problem)
        _write(store, where, checked_answer(message, self._global(owner), problem, self._global(self.rank)))
        return _alone(tune_here)

    def _agree(self, problem: str, pool: str, describe: str) -> None:
        """Every rank's (problem, pool) is this rank's, or DistributedTuneError on every rank."""
        everyone: list = [None] * self.world
        try:
            self.dist.all_gather_object(everyone, (problem, pool, describe), group=self.group)
        except RuntimeError as exc:
            raise DistributedTuneError(f"{describe} ({problem}): rank {self._global(self.rank)} waited in vain for "
                                       f"the other ranks to tune it too (a rank died, or made another tune or none "
                                       f"within {self.timeout_s:g} s; every rank must make the same tunes in the "
                                       f"same order): {exc}") from exc
        ranks = [self._global(r) for r in range(self.world)]
        why = disagreement(checked_announcements(everyone, ranks), ranks)
        if why is not None:
            raise DistributedTuneError(why)

    def _exchange(self, obj: list, owner: int, problem: str) -> list:
        try:
            self.dist.broadcast_object_list(obj, src=self._global(owner), group=self.group)
        except RuntimeError as exc:
            raise DistributedTuneError(f"{problem}: sharing the tune of rank {owner} failed on rank {self.rank} "
                                       f"(a rank died, or one did not answer within {self.timeout_s:g} s): {exc}") from exc
        return obj

    @contextlib.contextmanager
    def dealing(self, store: Any) -> Iterator[None]:
        """Tune this rank's share of a batch; on leaving, `store` gets every other rank's rows."""
        dealt: list[tuple[Any, tuple[str, dict, str, str]]] = []
        _STATE.dealt = dealt
        try:
            yield
        finally:
            _STATE.dealt = None
        mine = [(where, rows_of(s.load(where[0], where[2]))) for s, where in dealt]
        everyone: list = [None] * self.world
        try:
            self.dist.all_gather_object(everyone, mine, group=self.group)
        except RuntimeError as exc:
            raise DistributedTuneError(f"exchanging {len(mine)} dealt tunes failed on rank {self.rank} (a rank "
                                       f"died, or one did not answer within {self.timeout_s:g} s): {exc}") from exc
        shares = [checked_share(theirs, self._global(r)) for r, theirs in enumerate(everyone) if r != self.rank]
        for where, payload in (item for theirs in shares for item in theirs):  # all checked before any is written
            _write(store, where, payload)


def current(mode: str, timeout_s: float, group: Any = None) -> Job | None:
    """The job this tune is shared in, over `group` (None: the innermost `distributed_group`'s, else
    the default group); None when sharing is off, no group is initialised, a single rank runs, or
    this thread is already inside a shared tune.  A `group` that is not a ProcessGroup: TypeError."""
    group = checked_group(group)
    if mode == "off" or getattr(_STATE, "inside", False):
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    if group is None and _GIVEN:
        group = _GIVEN[-1]
    if dist.get_world_size(group) < 2:
        return None
    return Job(group, timeout_s)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Tunes inside the block are not shared (after a dealt batch: every rank's store answers)."""
    before = getattr(_STATE, "inside", False)
    _STATE.inside = True
    try:
        yield
    finally:
        _STATE.inside = before


def _alone(fn: Callable[[], T]) -> T:
    with alone():
        return fn()


def _write(store: Any, where: tuple[str, dict, str, str], payload: Payload) -> None:
    env, info, problem, describe = where
    rows, pick = payload
    if pick is not None:
        store.save(env, info, problem, describe, [Row(*r) for r in rows], Row(*pick), replace_pick=True)
