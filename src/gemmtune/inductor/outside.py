"""Buckets a compiled GEMM met outside its tuned range, tuned later, off the hot path.

A bucketed call (`dynamic.run_buckets`) at an M outside its entry's tuned range runs the nearest
bucket's pick and marks its own bucket (`dynamic.WANTED`, with the call's operands; counted in
`dynamic.STATS["wanted"]`): the call never tunes.  `tune_wanted()` tunes each marked bucket from
stand-ins of the problem at the bucket's M and records its pick (`dynamic.LATER`); the kernels built
for that bucket's M are dropped, so its calls then build the bucket's own pick.  The problem at the
bucket comes from the entry's family (which spells A's and B's sizes and strides with M), checked
against the marking call's operands: a family that does not describe the call is not tuned (a
warning names it; the nearest bucket's pick goes on serving it).  The compiled graph is unchanged.

Example:
    >>> import torch
    >>> from gemmtune.core.inputs import TensorMeta
    >>> call = [TensorMeta((3, 8), (8, 1), torch.float32, "cpu"), TensorMeta((8, 4), (1, 8), torch.float32, "cpu")]
    >>> [m.size for m in at_bucket("A(M, 8) (8, 1) float32; B(8, 4) (1, 8) float32; on cpu", call, 64)]
    [(64, 8), (8, 4)]
"""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Sequence

import torch

from ..core.inputs import TensorMeta, stand_in
from . import dynamic
from .extern import handler_settings
from .tuning import inductor_pool

__all__ = ["at_bucket", "tune_wanted"]

log = logging.getLogger("gemmtune")
_OPERAND = re.compile(r"([AB])\(([^)]*)\) \(([^)]*)\) (\w+)")
_TUNING = threading.Lock()  # one tune_wanted at a time: two would tune the same buckets


def _dims(text: str, m: int) -> tuple[int, ...]:
    """A spelled size or stride (`dynamic.family_text`) with M = `m`."""
    parts = [d.strip() for d in text.split(",")]
    if not all(d == "M" or d.isdigit() for d in parts):
        raise ValueError(f"not a size or stride: ({text[:40]})")
    return tuple(m if d == "M" else int(d) for d in parts)


def at_bucket(family: str, call: Sequence[TensorMeta], b: int) -> list[TensorMeta]:
    """The operands at M = `b` of the problem an entry's `family` names, which must describe `call` (the
    marking call's operands: an addmm's bias, A and B) at the call's M; a ValueError naming the entry
    where it does not.  A bias of M rows gets `b` rows (contiguous, or broadcast as it was)."""
    where = f"gemmtune bucketed GEMM entry {family[:80]!r}"
    found, (a, w), m = _OPERAND.findall(family), call[-2:], call[-2].size[0]
    if [name for name, *_ in found] != ["A", "B"] or not family.endswith(f"; on {a.device}"):
        raise ValueError(f"{where}: its family names no A and B on the call's device")
    metas = []
    for (_, size, stride, dtype), meta in zip(found, (a, w)):
        try:
            same = (_dims(size, m), _dims(stride, m), dtype) == (meta.size, meta.stride, str(meta.dtype)[6:])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if not same:
            raise ValueError(f"{where}: it does not describe the call's {meta.size} {meta.stride} {meta.dtype}")
        metas.append(TensorMeta(_dims(size, b), _dims(stride, b), meta.dtype, meta.device))
    if len(call) == 2:
        return metas
    bias = call[0]
    if len(bias.size) == 2 and bias.size[0] == m != 1:  # a bias of M rows
        n = bias.size[1]
        bias = TensorMeta((b, n), (0 if bias.stride[0] == 0 else n, 1), bias.dtype, bias.device)
    return [bias, *metas]


def tune_wanted() -> dict[int, int]:
    """Tune the buckets that bucketed calls met outside their entries' ranges, off the hot path, with the
    installed handler's settings and pool; returns `{bucket: entries tuned there}`.  Each such bucket's
    M then builds its own pick (`dynamic.LATER`).  See the module's docstring.

    Example:
        >>> import gemmtune.inductor as gi
        >>> from gemmtune.inductor import dynamic
        >>> dynamic.reset()   # nothing kept, nothing marked
        >>> gi.tune_wanted()
        {}
    """
    done: dict[int, int] = {}
    with _TUNING:
        with dynamic._LOCK:
            work = [(text, b, call) for text, wanted in dynamic.WANTED.items() for b, call in sorted(wanted.items())]
        settings, templates = handler_settings()
        for text, b, call in work:
            pick = _tune_bucket(text, b, call, settings, templates)
            with dynamic._LOCK:
                dynamic.WANTED.get(text, {}).pop(b, None)
                if pick is None:
                    continue
                dynamic.LATER.setdefault(text, {})[b] = pick
            dynamic.forget(text, b)
            done[b] = done.get(b, 0) + 1
    return done


def _tune_bucket(text: str, b: int, call: Sequence[TensorMeta], settings, templates: str) -> str | None:
    """The pick of an entry's problem at bucket `b`, tuned as every bucket is (stored, tag "inductor");
    None, with a warning, where the entry cannot be tuned there."""
    from ..engine import tune

    try:
        op, alpha, beta, _ = dynamic.parse_table(text)
        operands = at_bucket(json.loads(text)["family"], call, b)
        tensors = [stand_in(m.size, m.stride, m.dtype, m.device) for m in operands]
        with torch.no_grad():
            sel = tune(op, *tensors, alpha=alpha, beta=beta, store_tag="inductor", progress=False,
                       templates=inductor_pool(tensors[-1].device.type, templates, settings),
                       settings=settings.with_(distributed="off"))
    except Exception as exc:  # noqa: BLE001 - that bucket keeps its nearest pick; the others go on
        log.warning("gemmtune: bucket %d of a bucketed GEMM not tuned (%s: %s)", b, type(exc).__name__, exc)
        return None
    return str(sel.winner.key)
