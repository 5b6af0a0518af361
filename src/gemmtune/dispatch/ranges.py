"""Tuning over a range of M: every bucket of a problem family, then the family registered for dispatch.

`gemmtune.tune_buckets(op, *tensors, m=...)` tunes one call's family at each bucket of `m`
(`dispatch.buckets`); `gemmtune.warmup(model, x, m=...)` does it for every mm and addmm the model's
forward met (`bucket_problems`, tuned as the warm-up tunes its own problems: dealt across the ranks of a
distributed job, read from the store where it has them).  Afterwards a call of a registered family
at any M runs its bucket's pick without tuning.  A range warm-up checks the picks in the model at the
example's M, and with `inputs_at` at every bucket (`dispatch.checking`); a pick the check sends to
torch's op runs torch's op for its whole bucket.  It releases a layer (`dispatch.release`) only where
torch's op runs in every bucket (`generated_somewhere`): a released layer runs torch's op at every M.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..core.choices import torch_op
from ..core.errors import InputError
from ..core.inputs import stand_in
from ..core.settings import check_backends
from . import eager
from .buckets import BUCKETS, at_m, at_ms, bucket_of, buckets_for, family_of, parse_m, without_backends
from .table import TABLE, Recorded

__all__ = ["tune_buckets", "tune_wanted_buckets", "bucket_problems", "register_buckets", "generated_somewhere",
           "generated_at"]


def tune_buckets(op: str, *tensors: torch.Tensor, m: Any, backends: Sequence[str] | None = None,
                 alpha: float = 1.0, beta: float = 1.0) -> dict[int, Any]:
    """Tune the family of `op(*tensors)` (an mm or addmm; M left out) at every bucket of `m` (a range,
    a list of M, or "LO:HI"), register it for eager dispatch, and return `{bucket: Selection}`.  Later
    calls of the family, through `gemmtune.mm` / `addmm` or a patched `nn.Linear`, run their bucket's
    pick at any M without tuning (docs/MODELS.md, "Every batch size").

    Example:
        >>> import torch, gemmtune
        >>> w = torch.randn(16, 8)
        >>> picks = gemmtune.tune_buckets("mm", torch.randn(3, 8), w.t(), m=range(1, 33), backends=("extern",))
        >>> sorted(picks)
        [1, 2, 4, 8, 16, 32]
        >>> tunes = gemmtune.dispatch_stats()["tunes"]
        >>> _ = gemmtune.mm(torch.randn(21, 8), w.t(), backends=("extern",))
        >>> gemmtune.dispatch_stats()["tunes"] == tunes
        True
    """
    canon = check_backends(backends)
    if family_of(op, tensors, alpha, beta, canon, None) is None:
        raise InputError(f"tune_buckets: {op} with these operands has no M family (mm or addmm, A row- or "
                         f"column-major, a bias without a row per M)")
    picks, problems = {}, {}
    with BUCKETS.tuning():
        for b, operands in at_ms(op, tensors, buckets_for(parse_m(m))).items():
            rec = Recorded(op, operands, float(alpha), float(beta), canon, None)
            picks[b] = eager.prepare(op, rec.tensors, rec.alpha, rec.beta, canon, None)
            problems[eager.canonical_key(op, rec.tensors, rec.alpha, rec.beta, canon, None)] = rec
    register_buckets(problems)
    return picks


def bucket_problems(seen: "dict[tuple, Recorded]", m: Any) -> "dict[tuple, Recorded]":
    """The problems a range warm-up tunes: each recorded mm / addmm family at every bucket of `m`
    (those the forward itself met are not repeated).

    Example:
        >>> rec = Recorded("mm", (torch.randn(5, 4), torch.randn(4, 3)), 1.0, 1.0, None, None)
        >>> sorted(r.tensors[0].shape[0] for r in bucket_problems({"k": rec}, [1, 8]).values())
        [1, 2, 4, 8]
    """
    ms, out, families = parse_m(m, "warmup: m"), {}, set()
    for rec in seen.values():
        family = family_of(rec.op, rec.tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout)
        if family is None or family in families:
            continue
        families.add(family)
        for tensors in at_ms(rec.op, rec.tensors, buckets_for(ms)).values():
            key = eager.canonical_key(rec.op, tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout)
            if key not in seen:
                out[key] = Recorded(rec.op, tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout)
    return out


def register_buckets(problems: "dict[tuple, Recorded]") -> int:
    """Register each tuned problem of `problems` (tuned at a bucket's M) as its family's bucket; how many.
    A problem the dispatch met before as another bucket's pick (`pinned`) is tuned afresh first."""
    selections, n = eager.selections(), 0
    for canon, rec in problems.items():
        sel = selections.get(canon)
        family = family_of(rec.op, rec.tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout)
        m = rec.tensors[-2].shape[0]
        if sel is not None and family is not None and bucket_of(m) == m:
            if BUCKETS.is_pinned(sel):
                sel = _tune_afresh(rec.op, rec.tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout)
            BUCKETS.register(family, m, sel, (rec.op, rec.tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout))
            n += 1
    return n


def _tune_afresh(op: str, tensors: Sequence[torch.Tensor], alpha: float, beta: float, backends: Any,
                 out_layout: Any) -> Any:
    """A tune of its own for a bucket's problem (the store may answer), as the dispatch tunes (under its
    lock), never shared with other ranks (each meets its own M); the dispatch dict keeps what it holds."""
    from .. import engine
    from ..core.settings import Settings

    settings = Settings.from_env().with_(distributed="off")
    with TABLE.lock, torch.no_grad():
        sel = engine.tune(op, *tensors, backends=backends, alpha=alpha, beta=beta, out_layout=out_layout,
                          settings=settings, progress=False)
        TABLE.count_tune()
    return sel


def tune_wanted_buckets() -> dict[int, int]:
    """Tune the buckets that calls of registered families met outside their tuned range (each such call
    ran the nearest bucket's pick: `dispatch_stats()["buckets_wanted"]`), off the hot path, from stand-in
    operands of the family's sizes and strides; returns `{bucket: families tuned there}`.  A call at an
    M not met before then runs its own bucket's pick; an M already met keeps the kernel built for it.

    Example:
        >>> import torch, gemmtune
        >>> gemmtune.clear_dispatch_cache()
        >>> w = torch.randn(16, 8)
        >>> _ = gemmtune.tune_buckets("mm", torch.randn(3, 8), w.t(), m=range(1, 9), backends=("extern",))
        >>> _ = gemmtune.mm(torch.randn(40, 8), w.t(), backends=("extern",))  # bucket 64: bucket 8's pick
        >>> gemmtune.dispatch_stats()["buckets_wanted"], gemmtune.tune_wanted_buckets()
        (1, {64: 1})
        >>> gemmtune.dispatch_stats()["buckets_wanted"]
        0
    """
    with BUCKETS.lock:
        generation = BUCKETS.generation
        work = [(f, b, BUCKETS.examples[f]) for f, wanted in BUCKETS.wanted.items() if f in BUCKETS.examples
                for b in sorted(wanted)]
    done: dict[int, int] = {}
    for family, b, (op, metas, alpha, beta, backends, out_layout) in work:
        tensors = at_m(op, [stand_in(m.size, m.stride, m.dtype, m.device) for m in metas], b)
        sel = _tune_afresh(op, tensors, alpha, beta, backends, out_layout)
        BUCKETS.register(family, b, sel, generation=generation)
        done[b] = done.get(b, 0) + 1
    return done


def generated_somewhere(layer: Any, x: torch.Tensor) -> bool:
    """Whether a patched linear `layer`, called on `x`, belongs to a registered family (`dispatch.buckets`)
    with a pick that is not torch's own op in some bucket: such a layer stays patched after a range
    warm-up (`release_library_layers`'s `keep`).

    Example:
        >>> generated_somewhere(torch.nn.Linear(4, 2), torch.randn(3, 4))  # no family registered
        False
    """
    w, bias = layer.weight, layer.bias
    x2 = x.reshape(-1, x.shape[-1])
    op, tensors = ("mm", (x2, w.t())) if bias is None else ("addmm", (bias, x2, w.t()))
    mine = family_of(op, tensors, 1.0, 1.0, None, None)
    if mine is None:
        return False
    mine = without_backends(mine)  # under any `backends` its calls were tuned with: patched is the safe side
    with BUCKETS.lock:
        picks = [sel for fam, tuned in BUCKETS.families.items() if without_backends(fam) == mine
                 for sel in tuned.values()]
    return any(not torch_op(sel.winner) for sel in picks)


def generated_at(bucket: int) -> bool:
    """Whether some registered family's pick at `bucket` is not torch's own op (what `dispatch.checking`
    checks in the model there).

    Example:
        >>> BUCKETS.clear(); generated_at(64)
        False
    """
    with BUCKETS.lock:
        return any(bucket in tuned and not torch_op(tuned[bucket].winner) for tuned in BUCKETS.families.values())
