"""What one rank of a torch.distributed job sends another (`store.distributed`), and its check.

Another rank's message is untrusted input, like an entry read from a shared store: a rank with a bug,
another version of gemmtune, or a tune of another problem.  Every message is checked before anything
is written: its shape and types (a malformed message is a `DistributedTuneError` naming the rank that
sent it), and the problem it carries against the problem the receiving rank tunes.  Nothing is
written under a key the message was not made for.

Messages (plain tuples and lists of str, float, int and None; a `Row` as its fields' values):

- the announcement of a tune, gathered from every rank before the owner tunes: `(problem, pool,
  describe)`; `pool` is `pool_digest`'s digest of the candidates and the settings that decide them;
- the owner's answer: `("rows", problem, (rows, pick))` or `("error", problem, message)`;
- a dealt batch's share: `[((env, info, problem, describe), (rows, pick)), ...]`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Sequence

from ..core.errors import GemmtuneError
from .keys import Row, Stored, env_key

Payload = tuple[list[tuple], "tuple | None"]
_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(Row))
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "template": (str,), "src_hash": (str, type(None)), "config": (str,), "runtime": (str,),
    "ms": (float, int, type(None)), "status": (str,), "stage": (str, type(None)),
}
_SCALARS = (str, int, float, bool, type(None))


class DistributedTuneError(GemmtuneError, RuntimeError):
    """A tune shared across ranks failed: a rank died or timed out, the owner's tune raised, the ranks
    tuned different problems (or one problem from different candidates), or a rank sent a malformed message."""


def pool_digest(choices: Sequence[Any], plan: Any) -> str:
    """A digest of the candidate pool a tune searches: every choice (template, source hash, config,
    runtime; so the backends, templates, config space and lookup table that made them) and the plan's
    strategy and correctness check.  Ranks that share a tune must agree on it.

    Example:
        >>> from types import SimpleNamespace
        >>> from gemmtune.core.choices import Choice
        >>> plan = SimpleNamespace(asked="prescreen", check_correctness=True)
        >>> one, two = Choice("aten_mm", None), Choice("numpy_blas", None)
        >>> pool_digest([one, two], plan) == pool_digest([two, one], plan) != pool_digest([one], plan)
        True
    """
    seen = sorted(repr((c.template_uid, c.src_hash, tuple(c.config), tuple(c.runtime))) for c in choices)
    text = repr((seen, getattr(plan, "asked", None), getattr(plan, "check_correctness", None)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def rows_of(stored: Stored) -> Payload:
    """A problem's stored rows and pick as a message (the values of each Row's fields)."""
    return [tuple(vars(r).values()) for r in stored.rows], tuple(vars(stored.pick).values()) if stored.pick else None


def checked_announcements(everyone: list, ranks: Sequence[int]) -> list[tuple[str, str, str]]:
    """Each rank's `(problem, pool, describe)`, checked; `ranks[i]`: the global rank of entry i.

    Example:
        >>> checked_announcements([("p", "d", "mm 8x4")], [0])
        [('p', 'd', 'mm 8x4')]
        >>> checked_announcements([("p", 3, "x")], [5])
        Traceback (most recent call last):
        ...
        gemmtune.store.rank_messages.DistributedTuneError: rank 5 sent a malformed announcement of its tune (expected three strings, got tuple); nothing was stored
    """
    for rank, item in zip(ranks, everyone):
        if not (isinstance(item, tuple) and len(item) == 3 and all(isinstance(x, str) for x in item)):
            raise DistributedTuneError(f"rank {rank} sent a malformed announcement of its tune (expected three "
                                       f"strings, got {type(item).__name__}); nothing was stored")
    return list(everyone)


def disagreement(everyone: list[tuple[str, str, str]], ranks: Sequence[int]) -> str | None:
    """None when every rank announced the same tune; else the one line that names each rank's.

    Example:
        >>> print(disagreement([("a", "1", "mm 8x4"), ("b", "1", "mm 16x4")], [0, 1]))
        the ranks did not make the same tune: rank 0 tunes mm 8x4 (a), rank 1 tunes mm 16x4 (b); every rank of the group must make the same tunes in the same order (SPMD); nothing was stored
    """
    if all(item == everyone[0] for item in everyone):
        return None
    groups: dict[tuple[str, str, str], list[int]] = {}
    for rank, item in zip(ranks, everyone):
        groups.setdefault(item, []).append(rank)
    problems = {problem for problem, _, _ in groups}
    parts = []
    for (problem, pool, describe), members in groups.items():
        who = ("rank " if len(members) == 1 else "ranks ") + ", ".join(map(str, members))
        parts.append(f"{who} tunes {describe[:200]} ({problem[:300]}" + (f", candidate pool {pool[:32]})" if
                                                                       len(problems) == 1 else ")"))
    why = ("the ranks tune one problem from different candidate pools (their backends, templates, strategy or "
           "settings differ)" if len(problems) == 1 else "the ranks did not make the same tune")
    return (f"{why}: {', '.join(parts)}; every rank of the group must make the same tunes in the same order (SPMD); "
            f"nothing was stored")


def checked_answer(message: Any, sender: int, problem: str, rank: int) -> Payload:
    """The owner's rows and pick for `problem`; DistributedTuneError when it failed, sent another
    problem's, or sent something malformed."""
    if not (isinstance(message, tuple) and len(message) == 3 and message[0] in ("rows", "error")
            and isinstance(message[1], str)):
        raise DistributedTuneError(f"{problem}: rank {sender} (its owner) sent a malformed answer "
                                   f"({type(message).__name__}); nothing was stored")
    kind, theirs, body = message
    if theirs != problem:
        raise DistributedTuneError(f"rank {sender} sent its tune of {theirs[:300]} to rank {rank}, which tunes "
                                   f"{problem}; nothing was stored")
    if kind == "error":
        raise DistributedTuneError(f"{problem}: rank {sender} (its owner) failed to tune it: {str(body)[:2000]}")
    return checked_payload(body, f"rank {sender}'s rows for {problem}")


def checked_payload(body: Any, what: str) -> Payload:
    """`(rows, pick)`: a list of rows and a row or None, each row the values of Row's fields, checked."""
    if not (isinstance(body, tuple) and len(body) == 2 and isinstance(body[0], list)):
        raise DistributedTuneError(f"{what} are malformed: expected (rows, pick), got {type(body).__name__}; "
                                   f"nothing was stored")
    rows, pick = body
    for row in [*rows, *([] if pick is None else [pick])]:
        _check_row(row, what)
    return rows, pick


def _check_row(row: Any, what: str) -> None:
    if not (isinstance(row, tuple) and len(row) == len(_ROW_FIELDS)):
        raise DistributedTuneError(f"{what} are malformed: a row is {type(row).__name__} of "
                                   f"{len(row) if isinstance(row, (tuple, list)) else '?'} values, expected "
                                   f"{len(_ROW_FIELDS)} ({', '.join(_ROW_FIELDS)}); nothing was stored")
    for name, value in zip(_ROW_FIELDS, row):
        kinds = _FIELD_TYPES.get(name, _SCALARS)
        bad = isinstance(value, bool) or not isinstance(value, kinds)
        if name == "ms" and not bad and value is not None:
            bad = not math.isfinite(value) or value < 0
        if bad:
            raise DistributedTuneError(f"{what} are malformed: {name} is {type(value).__name__} "
                                       f"{str(value)[:60]!r}; nothing was stored")


def checked_share(theirs: Any, sender: int) -> list[tuple[tuple[str, dict, str, str], Payload]]:
    """A rank's share of a dealt batch: each item's key (env, info, problem, describe) and rows, checked;
    the env key must be the hash of the info it came with.

    Example:
        >>> checked_share([], 1)
        []
        >>> checked_share({"p": 1}, 3)
        Traceback (most recent call last):
        ...
        gemmtune.store.rank_messages.DistributedTuneError: rank 3 sent a malformed share of the dealt tunes (expected a list, got dict); nothing was stored
    """
    if not isinstance(theirs, list):
        raise DistributedTuneError(f"rank {sender} sent a malformed share of the dealt tunes (expected a list, "
                                   f"got {type(theirs).__name__}); nothing was stored")
    for item in theirs:
        where = _checked_where(item, sender)
        checked_payload(item[1], f"rank {sender}'s rows for {where[2][:300]}")
    return theirs


def _checked_where(item: Any, sender: int) -> tuple[str, dict, str, str]:
    """The key of one dealt tune: (env, info, problem, describe), its env key the hash of its info."""
    where = item[0] if isinstance(item, tuple) and len(item) == 2 else None
    if not (isinstance(where, tuple) and len(where) == 4 and isinstance(where[1], dict)
            and all(isinstance(x, str) for x in (where[0], where[2], where[3]))
            and all(isinstance(k, str) and isinstance(v, _SCALARS) for k, v in where[1].items())):
        raise DistributedTuneError(f"rank {sender} sent a malformed dealt tune (expected ((env, info, problem, "
                                   f"describe), (rows, pick))); nothing was stored")
    if env_key(where[1]) != where[0]:
        raise DistributedTuneError(f"rank {sender} sent a dealt tune of {where[2][:300]} whose env key "
                                   f"{where[0][:40]!r} is not its env's; nothing was stored")
    return where
