"""M buckets: one tune per bucket of M serves every M of a problem family in eager dispatch.

Serving and variable-length work run each layer's GEMM at many M (batch x tokens).  A *family* is an
`mm` or `addmm` problem with M left out: op, K, N, dtypes, layouts (row- or column-major A), the bias,
the scalars, `backends` and `out_layout`.  Its M axis is split into power-of-two buckets: bucket `b`
holds M in (b/2, b] and is tuned at M = b.  `gemmtune.warmup(model, x, m=...)` and
`gemmtune.tune_buckets` tune every bucket of a range (`dispatch.ranges`) and register the family here.

A miss of a registered family (`gemmtune.mm`, a patched `nn.Linear`) then builds its bucket's pick for
the call's own M without timing anything (`pinned`): the pick's template and config are the one
candidate (its binary is the bucket's: `triton_mm` bakes in N and K, not M), checked once against the
reference.  An M above or below the tuned range takes the nearest tuned bucket's pick and is counted
(`stats()["outside_buckets"]`); its bucket is marked for tuning (`stats()["buckets_wanted"]`), which
`gemmtune.tune_wanted_buckets()` does off the hot path; a family's pick the call's M cannot run (a
template not offered at that M) gives way to torch's own op.  No call of a registered family tunes.
A family nobody registered is tuned per M, as before.

Example:
    >>> [bucket_of(m) for m in (1, 2, 3, 64, 65, 4096)]
    [1, 2, 4, 64, 128, 4096]
    >>> buckets_for([1, 5, 100])
    [1, 2, 4, 8, 16, 32, 64, 128]

`parse_m` (`core.m_range`) reads the ranges `m=` and the CLI's `--m` name.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch

from ..core.choices import Choice, keep_only, torch_op
from ..core.inputs import TensorMeta
from ..core.m_range import bucket_of, buckets_for, parse_m
from .table import TABLE

__all__ = ["bucket_of", "buckets_for", "parse_m", "family_of", "without_backends", "at_m", "at_ms", "BUCKETS", "pinned",
           "stats"]

def family_of(op: str, tensors: Sequence[torch.Tensor], alpha: float, beta: float, backends: Any,
              out_layout: Any) -> tuple | None:
    """The family key of an mm or addmm call: the dispatch key with M left out; None where the problem
    has no family (bmm, scaled_mm, a bias with a row per M, an A neither row- nor column-major).

    Example:
        >>> w = torch.randn(8, 16)
        >>> family_of("mm", (torch.randn(3, 16), w.t()), 1.0, 1.0, None, None) == family_of(
        ...     "mm", (torch.randn(50, 16), w.t()), 1.0, 1.0, None, None)
        True
    """
    if op not in ("mm", "addmm"):
        return None
    a, b = tensors[-2], tensors[-1]
    m = a.shape[0]
    if a.stride(1) == 1 and (a.stride(0) == a.shape[1] or m == 1):
        layout = "row"
    elif a.stride(0) == 1 and (a.stride(1) == m or a.shape[1] == 1):
        layout = "col"
    else:
        return None
    key = (op, a.shape[1], a.dtype, a.device, layout, b.shape, b.stride(), b.dtype, b.device, backends, out_layout)
    if op == "mm":
        return key
    bias = tensors[0]
    if bias.dim() == 2 and bias.shape[0] == m and m > 1 and bias.stride(0) != 0:
        return None  # a bias with a row per M: its values are per call, not per family
    return (*key, bias.dim(), bias.shape[-1] if bias.dim() else None, bias.dtype, float(alpha), float(beta))


def without_backends(family: tuple) -> tuple:
    """`family` (a `family_of` key) with its `backends` left out: what a layer's families share whatever
    backends its calls were tuned under."""
    return family[:9] + family[10:]  # family_of's key: ..., b.device (8), backends (9), out_layout, ...


def at_m(op: str, tensors: Sequence[torch.Tensor], m: int, new: torch.Tensor | None = None) -> tuple:
    """Operands of the call's family at M = `m`: a new A (`new`, else random, in the call's layout), the
    rest as given (an addmm bias of one row is expanded to `m` rows with stride 0, as a broadcast bias is).

    Example:
        >>> a, b = at_m("mm", (torch.randn(3, 4), torch.randn(4, 2)), 64)
        >>> tuple(a.shape), tuple(b.shape)
        ((64, 4), (4, 2))
    """
    a = tensors[-2]
    k = a.shape[1]
    if new is None:
        new = (torch.randn(k, m, dtype=a.dtype, device=a.device).t() if _column_major(a)
               else torch.randn(m, k, dtype=a.dtype, device=a.device))
    if op == "mm":
        return new, tensors[1]
    bias = tensors[0]
    if bias.dim() == 2 and bias.shape[0] == a.shape[0] > 1:  # a row broadcast to every M (stride 0)
        bias = bias[:1].expand(m, bias.shape[1])
    return bias, new, tensors[2]


def at_ms(op: str, tensors: Sequence[torch.Tensor], ms: Sequence[int]) -> dict[int, tuple]:
    """`at_m` at each of `ms`; a row-major A of every M is the first M rows of one random A of the largest:
    half the random numbers of a new A per M (a range warm-up draws them for every family and bucket,
    whether the store answers or not), in the same layout.

    Example:
        >>> ops = at_ms("mm", (torch.randn(3, 4), torch.randn(4, 2)), [1, 8, 64])
        >>> [tuple(a.shape) for a, _ in ops.values()], ops[8][0].data_ptr() == ops[64][0].data_ptr()
        ([(1, 4), (8, 4), (64, 4)], True)
    """
    if not ms or _column_major(tensors[-2]):  # each M its own A
        return {m: at_m(op, tensors, m) for m in ms}
    top = at_m("mm", tensors[-2:], max(ms))[0]
    return {m: at_m(op, tensors, m, top[:m]) for m in ms}


def _column_major(a: torch.Tensor) -> bool:
    return a.stride(0) == 1 and a.stride(1) != 1


class BucketTable:
    """Registered families: for each, its tuned buckets' Selections (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: dict[tuple, dict[int, Any]] = {}
        self.examples: dict[tuple, tuple] = {}  # per family: (op, operands' TensorMetas, alpha, beta, ...)
        self.wanted: dict[tuple, set[int]] = {}  # per family: buckets calls met outside its tuned ones
        self.builds = 0  # picks built for a call's M from its bucket, without timing
        self.outside = 0  # calls whose M lay outside their family's tuned buckets
        self.generation = 0  # clears so far: a tune begun before one registers nothing
        self.pins: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # Selections `pinned` built
        self._range = threading.local()  # this thread's range tunes under way (`tuning`)

    @contextmanager
    def tuning(self) -> Iterator[None]:
        """While this thread tunes a range, its misses of a registered family tune their own M: `pinned`
        stands aside (a bucket tuned now must not take the nearest bucket's pick)."""
        self._range.depth = getattr(self._range, "depth", 0) + 1
        try:
            yield
        finally:
            self._range.depth -= 1

    def ranging(self) -> bool:
        return getattr(self._range, "depth", 0) > 0

    def is_pinned(self, selection: Any) -> bool:
        """Whether `selection` is a bucket's pick built for another M (`pinned`), not a tune of its own."""
        return self.pins.get(id(selection)) is selection

    def register(self, family: tuple, bucket: int, selection: Any, example: tuple | None = None,
                 generation: int | None = None) -> None:
        """Register `selection` as `family`'s pick at `bucket` (unless the table was cleared since
        `generation`); `example`: (op, operands, alpha, beta, backends, out_layout) of one of its calls,
        kept as sizes and strides: what `tune_wanted_buckets` tunes a wanted bucket from."""
        with self.lock:
            if generation is not None and generation != self.generation:
                return
            self.families.setdefault(family, {})[bucket] = selection
            self.wanted.get(family, set()).discard(bucket)
            kept = self.examples.get(family)
            if example is not None and (kept is None or kept[1][-2].size[0] < 2 <= example[1][-2].shape[0]):
                op, tensors, *rest = example  # an M of 2 or more shows A's layout and a broadcast bias
                self.examples[family] = (op, [TensorMeta.of(t) for t in tensors], *rest)

    def to_torch(self, family: tuple, bucket: int) -> None:
        """Run torch's own op for every M of `family`'s `bucket` met from now on in this process (the in-model
        check at that bucket sent its pick there: `dispatch.checking`); the store keeps the tuned pick."""
        with self.lock:
            sel = self.families.get(family, {}).get(bucket)
            lib = None if sel is None else next((t.choice for t in sel.timings if torch_op(t.choice)), None)
            if sel is not None and lib is not None and not torch_op(sel.winner):  # a tune with no torch op: kept
                self.families[family][bucket] = dataclasses.replace(sel, winner=lib, kernel=None)

    def lookup(self, family: tuple, m: int) -> Any:
        """The Selection of `m`'s bucket, else of the nearest tuned one (counted outside); None: no family."""
        with self.lock:
            tuned = self.families.get(family)
            if not tuned:
                return None
            b = bucket_of(m)
            if b not in tuned:
                self.outside += 1
                self.wanted.setdefault(family, set()).add(b)
                b = min(tuned, key=lambda t: (abs(t.bit_length() - b.bit_length()), -t))
            return tuned[b]

    def clear(self) -> None:
        with self.lock:
            self.families.clear()
            self.examples.clear()
            self.wanted.clear()
            self.generation += 1
            self.builds = self.outside = 0


BUCKETS = BucketTable()
TABLE.on_clear(BUCKETS.clear)  # `gemmtune.clear_dispatch_cache()` forgets the families too


def stats() -> dict[str, Any]:
    """`dispatch_stats()`' bucket counters: families registered, bucket builds, calls outside their range,
    buckets marked for tuning."""
    with BUCKETS.lock:
        return {"bucket_families": len(BUCKETS.families), "bucket_builds": BUCKETS.builds,
                "outside_buckets": BUCKETS.outside, "buckets_wanted": sum(map(len, BUCKETS.wanted.values()))}


def pinned(op: str, tensors: tuple, alpha: float, beta: float, backends: tuple[str, ...] | None,
           out_layout: str | None) -> Any:
    """The Selection of a call whose family is registered: its bucket's pick built for the call's M
    (nothing timed; checked once; nothing stored or shared with other ranks), or where the call's M
    cannot run that pick, torch's own op (the pool's first candidate where `backends` leaves torch's op
    out).  None where the call's family is not registered (the caller tunes)."""
    family = None if BUCKETS.ranging() else family_of(op, tensors, alpha, beta, backends, out_layout)
    bucket = None if family is None else BUCKETS.lookup(family, tensors[-2].shape[0])
    if bucket is None:
        return None
    from .. import engine
    from ..core.settings import Settings

    winner: Choice = bucket.winner
    settings = Settings.from_env().with_(store="off", distributed="off")  # each rank meets its own M
    sel = engine.tune(op, *tensors, backends=backends, alpha=alpha, beta=beta, out_layout=out_layout,
                      finalize=[keep_only(winner.key)], settings=settings, progress=False)
    with BUCKETS.lock:
        BUCKETS.builds += 1
        BUCKETS.pins[id(sel)] = sel
    return sel
