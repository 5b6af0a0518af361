"""The dispatch table: everything this process keeps about dispatched GEMM problems, in one object.

`TABLE` (one `DispatchTable` per process) holds, behind one lock:

- the runners, one dict per op (`runners["mm"]` etc.): dispatch key -> the callable that computes
  the problem (`torch.mm` itself for an aten winner, else the Selection's kernel behind an autograd
  check).  The eager ops (`gemmtune.dispatch.eager`) read these dicts without the lock: that is
  their warm path;
- the Selection behind every tuned problem, by canonical key (for inspection);
- the counters `gemmtune.dispatch_stats` reports (hits, misses, tunes);
- the hooks: what `clear()` also clears (`on_clear`: the traced decisions, the patched layers'
  fast paths) and who is told when a `recording()` block starts and ends (`on_recording`);
- the recorder: inside `recording()`, the problems met instead of tuned.

The key (`dispatch_key`) is a plain tuple of every operand's shape, strides, dtype and device,
addmm's scalars with their types, `backends` and `out_layout`.

Example:
    >>> import torch
    >>> table = DispatchTable()
    >>> cleared = []
    >>> _ = table.on_clear(lambda: cleared.append(True))
    >>> key = dispatch_key("mm", (torch.randn(2, 3), torch.randn(3, 4)), 1.0, 1.0, None, None)
    >>> table.put("mm", torch.mm, key); table.count_miss()
    >>> table.runner("mm", key) is torch.mm, table.stats()["entries"]
    (True, 1)
    >>> table.clear(); table.stats()["entries"], cleared
    (0, [True])
"""

from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

__all__ = ["DispatchTable", "Recorded", "TABLE", "dispatch_key", "is_empty", "OPS"]

OPS = ("mm", "addmm", "bmm", "scaled_mm")
Runner = Callable[..., torch.Tensor]


def dispatch_key(op: str, tensors: Sequence[torch.Tensor], alpha: Any, beta: Any, backends: Any,
                 out_layout: Any) -> tuple:
    """The key a problem's runner is kept under; equal to the inline tuples of the eager ops' warm path.

    Shape, strides, dtype and device of every operand, addmm's scalars with their types (True and
    1+0j equal 1.0 in a dict, but the cold path refuses them, so the warm path refuses them too).

    Example:
        >>> k = dispatch_key("mm", (torch.ones(2, 3), torch.ones(3, 4)), 1.0, 1.0, ("extern",), None)
        >>> k[0], k[-2:]
        (torch.Size([2, 3]), (('extern',), None))
    """
    a, b = tensors[-2], tensors[-1]
    mats = (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device)
    if op == "addmm":
        bias = tensors[0]
        return ((bias.shape, bias.stride(), bias.dtype, bias.device) + mats
                + (alpha, alpha.__class__, beta, beta.__class__, backends, out_layout))
    return mats + (backends, out_layout)


def is_empty(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether a problem has nothing to compute (an empty `a` or `b`): torch's op runs it, untuned.

    Example:
        >>> is_empty((torch.ones(0, 3), torch.ones(3, 2))), is_empty((torch.ones(1, 3), torch.ones(3, 2)))
        (True, False)
    """
    return tensors[-2].numel() == 0 or tensors[-1].numel() == 0


@dataclass
class Recorded:
    """One GEMM problem met while recording: its operands (detached) and how often it was met.

    Example:
        >>> Recorded("mm", (torch.ones(4, 3), torch.ones(3, 2)), 1.0, 1.0, None, None).describe()
        'mm(4x3, 3x2)'
    """

    op: str
    tensors: tuple
    alpha: float
    beta: float
    backends: tuple[str, ...] | None
    out_layout: str | None
    calls: int = 0
    options: tuple = ()  # scaled_mm's (name, value) pairs: out_dtype, fast_accum

    def describe(self) -> str:
        shapes = ", ".join("x".join(map(str, t.shape)) or "scalar" for t in self.tensors)
        return f"{self.op}({shapes})"


def _count(counter: itertools.count) -> int:
    """The next value of an `itertools.count` without advancing it."""
    return int(repr(counter)[len("count("):-1])


class DispatchTable:
    """The runners, Selections, counters, hooks and recorder of eager dispatch, behind one lock.

    `lock` (re-entrant) is held by every miss and every change; the warm path reads `runners[op]`
    without it and counts a hit with `next(hits)` (atomic).  `recorder` is None outside a
    `recording()` block (read it; only `recording()` sets it).  See the module docstring.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.runners: dict[str, dict[tuple, Runner]] = {op: {} for op in OPS}
        self.hits = itertools.count()  # the warm path's counter: next() on it is atomic
        self.recorder: dict[tuple, Recorded] | None = None
        self._hits_base = 0  # `hits` at the last clear(): the counter object itself is never replaced
        self._misses = 0
        self._tunes = 0
        self._selections: dict[tuple, Any] = {}
        self._clear_hooks: list[Callable[[], None]] = []
        self._record_hooks: list[Callable[[bool], None]] = []

    # -- hooks ---------------------------------------------------------------------------------

    def on_clear(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run `hook()` on every `clear()` (under the lock, after the runners are gone); returns it."""
        with self.lock:
            self._clear_hooks.append(hook)
        return hook

    def on_recording(self, hook: Callable[[bool], None]) -> Callable[[bool], None]:
        """Call `hook(True)` when a `recording()` block starts and `hook(False)` when it ends; returns it."""
        with self.lock:
            self._record_hooks.append(hook)
        return hook

    # -- runners, Selections, counters ---------------------------------------------------------

    def runner(self, op: str, key: tuple) -> Runner | None:
        """The callable kept for `key` under `op` (None: not dispatched in this process)."""
        return self.runners[op].get(key)

    def put(self, op: str, fn: Runner, *keys: tuple | None) -> None:
        """Keep `fn` as the runner of `op` under each key (a None key is skipped)."""
        with self.lock:
            table = self.runners[op]
            for key in keys:
                if key is not None:
                    table[key] = fn

    def replace_runner(self, op: str, old: Runner, new: Runner, keys: Sequence[tuple] | None = None) -> list[tuple]:
        """Entries of `op` running `old` (every key, or only `keys`) run `new` from now on; their keys."""
        with self.lock:
            table = self.runners[op]
            chosen = [k for k in (table if keys is None else keys) if table.get(k) is old]
            for k in chosen:
                table[k] = new
            return chosen

    def add_selection(self, canon: tuple, selection: Any) -> None:
        """Keep the Selection a tune decided for the problem of canonical key `canon`."""
        with self.lock:
            self._selections[canon] = selection

    def selection(self, canon: tuple) -> Any:
        """The Selection kept for `canon`, or None."""
        return self._selections.get(canon)

    def selections(self) -> dict[tuple, Any]:
        """Every kept Selection by canonical key (a copy)."""
        with self.lock:
            return dict(self._selections)

    def dispatched(self, op: str, canon: tuple) -> tuple[Any, Runner] | None:
        """(Selection, runner) of a problem tuned in this process; None if not, or while recording."""
        with self.lock:
            if self.recorder is not None:
                return None
            sel, fn = self._selections.get(canon), self.runners[op].get(canon)
        return None if sel is None or fn is None else (sel, fn)

    def count_miss(self) -> None:
        with self.lock:
            self._misses += 1

    def count_tune(self) -> None:
        with self.lock:
            self._tunes += 1

    def stats(self) -> dict[str, Any]:
        """`gemmtune.dispatch_stats()`: hits, misses, tunes, entries, and the winner per Selection."""
        with self.lock:
            selections = {f"{sel.problem.problem_key} backends={key[-2]} out_layout={key[-1]}": sel.winner.name
                          for key, sel in self._selections.items()}
            return {"hits": _count(self.hits) - self._hits_base, "misses": self._misses, "tunes": self._tunes,
                    "entries": sum(len(t) for t in self.runners.values()), "selections": selections}

    def clear(self) -> None:
        """Forget every runner and Selection, reset the counters, then run the `on_clear` hooks."""
        with self.lock:
            for table in self.runners.values():
                table.clear()
            self._selections.clear()
            self._hits_base = _count(self.hits)
            self._misses = self._tunes = 0
            for hook in self._clear_hooks:
                hook()

    # -- recording -----------------------------------------------------------------------------

    @contextmanager
    def recording(self) -> Iterator[dict[tuple, Recorded]]:
        """Within the block the runners are set aside (restored after it) and `recorder` is a dict,
        canonical key -> `Recorded`, which is yielded; the `on_recording` hooks hear of both ends."""
        with self.lock:
            if self.recorder is not None:
                raise RuntimeError("gemmtune: recording() blocks cannot be nested")
            saved = {op: dict(table) for op, table in self.runners.items()}
            for table in self.runners.values():
                table.clear()
            record = self.recorder = {}
            for hook in self._record_hooks:
                hook(True)
        try:
            yield record
        finally:
            with self.lock:
                self.recorder = None
                for op, table in self.runners.items():
                    table.update(saved[op])
                for hook in self._record_hooks:
                    hook(False)

    def record(self, canon: tuple, op: str, tensors: tuple, alpha: float, beta: float,
               backends: tuple[str, ...] | None, out_layout: str | None, options: tuple = ()) -> Recorded:
        """Count one call of a problem met inside `recording()` (its operands kept detached, once)."""
        with self.lock:
            if self.recorder is None:
                raise RuntimeError("gemmtune: record() outside a recording() block")
            rec = self.recorder.get(canon)
            if rec is None:
                rec = self.recorder[canon] = Recorded(op, tuple(t.detach() for t in tensors), alpha, beta,
                                                      backends, out_layout, options=options)
            rec.calls += 1
            return rec


TABLE = DispatchTable()
"""This process's dispatch table (what `gemmtune.mm` & co., patched layers and warm-ups share)."""
