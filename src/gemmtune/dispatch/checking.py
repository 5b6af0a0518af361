"""The warm-up's in-model checks: at the example's M, and with `inputs_at`, at each bucket of a range.

`checked` runs `dispatch.in_model`'s check for the problems the warm-up's forward met whose pick is not
torch's own op, or applies the verdicts the store keeps for this model, these picks and this machine
(`dispatch.verdicts`).

A range warm-up (`warmup(model, x, m=...)`) tunes every bucket of M, but its forward runs at one M.
An eager forward at a small M is bound by host time, where a generated pick's launch can cost more
than its kernel saves, and a large M is bound by the GPU: one forward cannot decide for both.  Given
`inputs_at` (the model's inputs at an M), `check_buckets` runs the check at each bucket where some
family's pick is generated: the forward at that bucket's inputs, with each pick and with torch's op.  A
pick the forward runs faster without is sent to torch's op for its whole bucket in this process
(`BucketTable.to_torch`): every M of that bucket met from then on runs torch's op (an M met before
keeps the kernel built for it), and a layer whose buckets all run it is released
(`ranges.generated_somewhere`).  Each (family, bucket) is decided once per warm-up, the example's M
first.  The store keeps the tuned picks, as for any verdict.

Example:
    >>> checked([], {}, lambda: None, None, again=False)
    []
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch

from . import eager, verdicts
from .buckets import BUCKETS, bucket_of, family_of
from .in_model import InModel, Switch, check_in_model
from .ranges import generated_at
from ..core.settings import Settings
from ..measure import deferred
from ..store.locations import shared_store
from ..store.trust import Trust

__all__ = ["TORCH_OPS", "checked", "check_buckets", "kept_to_torch", "pick_keys"]

log = logging.getLogger("gemmtune")
TORCH_OPS = frozenset({"aten_mm", "aten_addmm", "aten_bmm", "aten_bias_addmm", "aten_scaled_mm"})
"""Library picks that are torch's own op: what the in-model check compares the others against."""


def checked(rows: list, seen: "dict[tuple, eager.Recorded]", forward: Any, model: Any, again: bool,
            decided: set | None = None, sent: set | None = None) -> list:
    """`rows` (one per problem of `seen`, in order) with the in-model verdicts of the problems whose
    winner is not torch's own op (a generated kernel, NumPy's BLAS) and whose backends allow the library
    kernel (a caller who left it out, or whose environment did, gets no torch op).  Verdicts the store
    keeps for this model, these picks and this machine are applied instead of timed
    (`dispatch.verdicts`), unless `again`.  `decided`: the (family, bucket) pairs decided so far in this
    warm-up (`verdicts_for`); `sent` gathers the `deferred.pick_key` of each pick a kept verdict sent to torch's op."""
    out = list(rows)
    for i, verdict in verdicts_for(seen, forward, model, again, decided, sent):
        out[i] = replace(out[i], in_model=verdict)
    return out


def verdicts_for(seen: "dict[tuple, eager.Recorded]", forward: Any, model: Any, again: bool,
                 decided: set | None = None, sent: set | None = None) -> list[tuple[int, InModel]]:
    """(index in `seen`, verdict) of each problem `checked` decides; [] where none is decided.  A problem
    of a family registered over M is decided once per bucket in a warm-up (`decided`, which this fills:
    a later forward that meets the bucket again leaves it), and a pick sent to torch's op goes there for
    its whole bucket (`BucketTable.to_torch`).  `sent`: as `checked`'s."""
    decided = set() if decided is None else decided
    switches, at = _switches(seen, decided)
    if not switches:
        return []
    store, key, found = _kept(seen, model, switches, again)
    if found is not None:
        to_torch = _to_torch(switches, found)
        found = _applied(forward, switches, found, to_torch)
        if found is not None and sent is not None:
            sent |= to_torch
    else:
        found = _timed(forward, switches, Settings.from_env().library_margin)
        if found is not None and key is not None:
            verdicts.keep(store, key, found, [sw.selection.problem.problem_key for sw in switches])
    if found is None:
        return []
    records = list(seen.values())
    for i, verdict in zip(at, found):  # a registered family's bucket follows its M's verdict
        family_bucket = _bucket(records[i])
        if family_bucket is not None:
            decided.add(family_bucket)
            if not verdict.kept:
                BUCKETS.to_torch(*family_bucket)
    return list(zip(at, found))


def kept_to_torch(seen: "dict[tuple, eager.Recorded]", model: Any, again: bool, decided: set | None = None) -> set:
    """The `deferred.pick_key` of each pick the verdicts kept for this model (`dispatch.verdicts`) send to
    torch's op: `checked` will apply them, so a warm-up need not build those picks (`deferred.standing_in`).
    Nothing is run."""
    switches, _ = _switches(seen, set() if decided is None else decided)
    found = _kept(seen, model, switches, again)[2] if switches else None
    return _to_torch(switches, found or [])


def _to_torch(switches: Sequence[Switch], found: Sequence[InModel]) -> set[str]:
    """The `deferred.pick_key` of each switch whose verdict sends its pick to torch's op."""
    return {_pick(sw.selection) for sw, verdict in zip(switches, found) if not verdict.kept}


def _pick(sel: Any) -> str:
    return deferred.pick_key(sel.problem.problem_key, sel.winner.name)


def pick_keys(seen: "dict[tuple, eager.Recorded]") -> set[str]:
    """The `deferred.pick_key` of the Selections behind the problems of `seen` (those tuned or read so far)."""
    selections = eager.selections()
    return {_pick(sel) for canon in seen if (sel := selections.get(canon)) is not None}


def _switches(seen: "dict[tuple, eager.Recorded]", decided: set) -> tuple[list[Switch], list[int]]:
    """A Switch for each problem of `seen` the check decides (its pick neither torch's op nor fp8, the library
    kernel allowed, its (family, bucket) not in `decided`), and its index in `seen`."""
    switches, at = [], []
    selections, settings = eager.selections(), Settings.from_env()
    for i, (canon, rec) in enumerate(seen.items()):
        sel, backends = selections.get(canon), rec.backends if rec.backends is not None else settings.backends
        if (sel is None or sel.winner.template_uid in TORCH_OPS or rec.op == "scaled_mm"
                or (backends is not None and "extern" not in backends) or _bucket(rec) in decided):
            continue
        switches.append(Switch(rec.op, canon, sel, rec.alpha, rec.beta, rec.out_layout))
        at.append(i)
    return switches, at


def _kept(seen: "dict[tuple, eager.Recorded]", model: Any, switches: list[Switch],
          again: bool) -> tuple[Any, str | None, list[InModel] | None]:
    """(the store, the verdicts' key, the kept verdict of each switch or None) for this model's check."""
    settings, selections = Settings.from_env(), eager.selections()
    key = verdicts.verdict_key(model, [(rec.describe(), selections.get(canon), rec.calls)
                                       for canon, rec in seen.items()], settings.library_margin)
    store = shared_store(settings.store, Trust.of(settings))
    return store, key, None if again or key is None else verdicts.matching(verdicts.kept(store, key), switches)


def _bucket(rec: "eager.Recorded") -> tuple | None:
    """(family, bucket) of a recorded mm or addmm (None: a problem with no family)."""
    family = family_of(rec.op, rec.tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout)
    return None if family is None else (family, bucket_of(rec.tensors[-2].shape[0]))


def _applied(forward: Any, switches: list[Switch], found: list[InModel], to_torch: set[str]) -> list[InModel] | None:
    """The kept verdicts applied (a pick the check sent to torch's op goes there again; `to_torch`, their
    `deferred.pick_key`, stay unbuilt meanwhile); None where the forward failed when run again (the tuned
    picks stand)."""
    try:
        with deferred.standing_in(to_torch):
            forward()  # as the check's first forward: patched layers remember the pick's kernel
    except Exception as exc:  # noqa: BLE001 - as in `_timed`
        log.warning("gemmtune.warmup: kept in-model verdicts not applied, the forward failed when run again "
                    "(%s: %s); the tuned picks run", type(exc).__name__, exc)
        return None
    for sw, verdict in zip(switches, found):
        sw.library(not verdict.kept)
    return found


def _timed(forward: Any, switches: list[Switch], margin: float) -> list[InModel] | None:
    """The check's verdicts, timed now; None where the forward failed when run again (the tuned picks stand)."""
    cuda = any(sw.selection.problem.device_type == "cuda" for sw in switches)
    try:
        return check_in_model(forward, switches, margin=margin, cuda=cuda)
    except Exception as exc:  # noqa: BLE001 - the forward failed when run again: the tuned picks stand
        for sw in switches:
            sw.library(False)
        log.warning("gemmtune.warmup: in-model check skipped, the forward failed when run again (%s: %s); "
                    "the tuned picks run", type(exc).__name__, exc)
        return None


def check_buckets(forward_at: Callable[[int], Callable[[], Any]], buckets: Sequence[int], model: Any,
                  again: bool, decided: set, pending: Sequence[deferred.LaterBuild] = (),
                  sent: set | None = None) -> list[tuple[tuple, "eager.Recorded", Any, InModel]]:
    """The in-model check at each of `buckets` where a registered family's pick is generated
    (`forward_at(b)`: the model's forward at that bucket's inputs): (dispatch key, problem, its Selection,
    verdict) per problem decided.  A pick sent to torch's op goes there for its whole bucket
    (`BucketTable.to_torch`); a (family, bucket) in `decided` is not checked again.  A forward that fails
    at a bucket is named once and its bucket left as tuned.  Of `pending` (a warm-up's unbuilt picks), those
    of the problems a bucket's forward meets are built together before its check, but those its kept
    verdicts send to torch's op (`kept_to_torch`); `sent`: as `checked`'s."""
    out = []
    for b in buckets:
        if not generated_at(b):
            continue
        try:
            forward = forward_at(b)
            with eager.recording() as seen, torch.no_grad():
                forward()
            to_torch = kept_to_torch(seen, model, again, decided)
            deferred.build_all(pending, skip=to_torch, only=pick_keys(seen))
            with torch.no_grad(), deferred.standing_in(to_torch):
                forward()  # builds each problem's bucket pick for its M (nothing timed)
        except Exception as exc:  # noqa: BLE001 - the user's inputs or model at this M: that bucket unchecked
            log.warning("gemmtune.warmup: the forward at bucket M = %d failed (%s: %s); that bucket's picks are "
                        "not checked in the model", b, type(exc).__name__, exc)
            continue
        selections = eager.selections()
        with torch.no_grad():
            found = verdicts_for(seen, forward, model, again, decided, sent)
        records = list(seen.items())
        out += [(*records[i], selections.get(records[i][0]), verdict) for i, verdict in found]
    return out
