"""Buckets a compiled GEMM met outside its tuned range, tuned later, off the hot path.

A bucketed call (`dynamic.run_buckets`) at an M outside its entry's tuned range runs the nearest
bucket's pick and marks its own bucket (`dynamic.WANTED`, counted in `dynamic.STATS["wanted"]`): the
call never tunes.  `tune_wanted()` tunes each marked bucket from stand-ins of the problem at the
bucket's M (the entry's family spells A's and B's sizes and strides with M; an addmm's bias follows
the marking call's) and records its pick (`dynamic.LATER`); the kernels built for that bucket's M are
dropped, so its calls then build the bucket's own pick.  The compiled graph is unchanged: its entry
names the family, and the later picks are kept beside it in this process (and in the store, as every
bucket's tune is).

Example:
    >>> import torch
    >>> A = "A(M, 8) (8, 1) float32; B(8, 4) (1, 8) float32; on cpu"
    >>> [(m.size, m.stride) for m in at_bucket(A, None, 64)]
    [((64, 8), (8, 1)), ((8, 4), (1, 8))]
"""

from __future__ import annotations

import json
import re

import torch

from ..core.inputs import TensorMeta, stand_in
from ..core.m_range import bucket_of
from . import dynamic
from .extern import handler_settings
from .tuning import inductor_pool

__all__ = ["at_bucket", "tune_wanted"]

_OPERAND = re.compile(r"([AB])\(([^)]*)\) \(([^)]*)\) (\w+)")


def at_bucket(family: str, bias: TensorMeta | None, b: int) -> list[TensorMeta]:
    """The operands of an entry's `family` (`dynamic.family_text`) at M = `b`: A's and B's, after an
    addmm's `bias` (a marking call's, its rows set to `b` where it has M rows; contiguous then)."""
    *_, device = family.rpartition("; on ")
    dims = lambda text: tuple(b if d.strip() == "M" else int(d) for d in text.split(","))  # noqa: E731
    metas = [TensorMeta(dims(size), dims(stride), getattr(torch, dtype), device)
             for _, size, stride, dtype in _OPERAND.findall(family)]
    if len(metas) != 2:
        raise ValueError(f"gemmtune bucketed GEMM entry: its family names no A and B: {family[:80]!r}")
    if bias is None:
        return metas
    if len(bias.size) == 2 and bias.size[0] != 1:  # a bias of M rows (broadcast or not)
        n = bias.size[1]
        bias = TensorMeta((b, n), (0 if bias.stride[0] == 0 else n, 1), bias.dtype, bias.device)
    return [bias, *metas]


def tune_wanted() -> dict[int, int]:
    """Tune the buckets that bucketed calls met outside their entries' ranges, off the hot path, with the
    installed handler's settings and pool; returns `{bucket: entries tuned there}`.  Each such bucket's
    M then builds its own pick (`dynamic.LATER`).  See the module's docstring.

    Example:
        >>> import gemmtune.inductor as gi
        >>> gi.tune_wanted()   # no bucketed call has met an M outside its range yet
        {}
    """
    from ..engine import tune

    with dynamic._LOCK:
        work = [(text, b, metas) for text, wanted in dynamic.WANTED.items() for b, metas in sorted(wanted.items())]
    settings, templates = handler_settings()
    done: dict[int, int] = {}
    for text, b, metas in work:
        op, alpha, beta, _ = dynamic.parse_table(text)
        operands = at_bucket(json.loads(text)["family"], metas[0] if op == "addmm" else None, b)
        tensors = [stand_in(m.size, m.stride, m.dtype, m.device) for m in operands]
        with torch.no_grad():
            sel = tune(op, *tensors, alpha=alpha, beta=beta, store_tag="inductor", progress=False,
                       templates=inductor_pool(tensors[-1].device.type, templates, settings),
                       settings=settings.with_(distributed="off"))
        with dynamic._LOCK:
            dynamic.LATER.setdefault(text, {})[b] = sel.winner.key
            dynamic.WANTED.get(text, {}).pop(b, None)
            for key in [k for k in dynamic._KERNELS if k[0] == text and bucket_of(k[1][0]) == b]:
                del dynamic._KERNELS[key]
        done[b] = done.get(b, 0) + 1
    return done
