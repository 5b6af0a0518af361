"""The in-model check: does a generated pick make the model's forward faster than torch's own op?

A pick is timed back to back, where a kernel's host launch cost hides behind the kernel before it.
An eager forward at small batch is launch-bound: the host, not the GPU, sets its pace, and a Triton
launch costs a few microseconds more host time than a cuBLAS call.  On a Llama-shaped stack at 64
tokens, picks that saved no GPU time in the model ran the forward 1.15x slower (docs/MODELS.md).

On CPU a pick that is not torch's own op runs on another thread pool (numba's, NumPy's BLAS), which
fights torch's for the cores next to the model's other ops: a pick as fast as aten alone took 10x its
time after a LayerNorm (docs/ARCHITECTURE.md), so those picks are checked the same way.

`check_in_model` settles it where the user pays: for each problem whose pick is not torch's own op,
the model's forward is timed with the pick and with torch's own op for that problem, interleaved in
rounds (drift hits both alike), and the pick stays only if the forward runs faster with it by more
than `margin` in three rounds out of four (the lower quartile of the per-round ratios): a launch-
bound forward's time moves by a few percent between rounds, and a tie goes to torch's op.  The picks
are tested together first, then one by one (each with the earlier decisions in place), and a subset
that survives is tested together again: one pick's effect can be smaller than the drift between
timed blocks, and the model runs the picks together.
The switch touches only this process's dispatch (the eager dict and patched layers); the store
keeps the tuned pick, so a CUDA graph or a compiled program is not affected.  `warmup` keeps the verdicts in the store
for this model, these picks and this machine, and a later warm-up applies them (`dispatch.verdicts`).

Example:
    >>> InModel("mm(64x4096, 4096x4096)", "triton_mm", 0.97, False, 0.95).runs
    'torch (in-model check)'
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from . import eager, patching
from .table import TABLE

__all__ = ["InModel", "check_in_model", "Switch"]

ROUNDS = 16
BLOCK_S = 0.008  # each timed block runs about this long (whole forwards)
MAX_ITERS = 50

Measure = Callable[[Callable[[], Any], int], float]
"""`measure(forward, iters) -> seconds` for `iters` forwards back to back."""


@dataclass(frozen=True)
class InModel:
    """One problem's verdict: `ratio` is the forward's time with torch's op over its time with the
    pick (median of the rounds; above 1: the pick makes the forward faster), `q1` its lower quartile;
    `kept`: the pick runs."""

    problem: str
    winner: str
    ratio: float
    kept: bool
    q1: float = 0.0
    together: bool = False  # decided with other picks: the forward with all of them against torch's op
    stored: bool = False  # read from the store (`dispatch.verdicts`), not timed in this process

    @property
    def runs(self) -> str:
        """What the model runs for this problem after the check."""
        return self.winner if self.kept else "torch (in-model check)"


_SENT: dict[tuple, tuple] = {}  # (op, canon) a switch left on torch's op: (Selection, pick, torch's op, keys)
TABLE.on_clear(_SENT.clear)


class Switch:
    """Sends one tuned problem to torch's own op and back: its eager dispatch entries (under every key
    spelling) and the patched layers that remembered it.  A problem an earlier switch left on torch's op
    (an earlier warm-up's check) starts there, and goes back to the pick's own runner.

    Example:
        >>> import torch
        >>> a, b = torch.randn(4, 3), torch.randn(3, 2)
        >>> sel = eager.prepare("mm", (a, b), 1.0, 1.0, ("extern",), None)
        >>> canon = eager.canonical_key("mm", (a, b), 1.0, 1.0, ("extern",), None)
        >>> sw = Switch("mm", canon, sel, 1.0, 1.0, None)
        >>> sw.library(True); sw.library(False)
    """

    def __init__(self, op: str, canon: tuple, selection: Any, alpha: float, beta: float, out_layout: str | None):
        self.op, self.canon, self.selection = op, canon, selection
        self.pick = TABLE.runner(op, canon)
        self.torch_op = eager.library_runner(op, alpha, beta, out_layout)
        self.on_library = False
        self._keys: list[tuple] = []
        sent = _SENT.get((op, canon))
        if sent is not None and sent[0] is selection and self.pick is sent[2]:  # still as that switch left it
            _, self.pick, self.torch_op, self._keys = sent
            self.on_library = True

    def library(self, on: bool) -> None:
        if on == self.on_library or self.pick is None:
            return
        if on:  # this problem's entries only: torch's op is shared by every problem sent to it
            self._keys = TABLE.replace_runner(self.op, self.pick, self.torch_op)
            _SENT[self.op, self.canon] = (self.selection, self.pick, self.torch_op, self._keys)
        else:
            TABLE.replace_runner(self.op, self.torch_op, self.pick, self._keys)
            _SENT.pop((self.op, self.canon), None)
        patching.set_library(self.selection, on)
        self.on_library = on


def block_seconds(forward: Callable[[], Any], iters: int, cuda: bool) -> float:
    """Wall time of `iters` forwards back to back (CUDA: events around them, the queue drained first).

    Example:
        >>> block_seconds(lambda: None, 3, cuda=False) >= 0.0
        True
    """
    if not cuda:
        t0 = time.perf_counter()
        for _ in range(iters):
            forward()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        forward()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def check_in_model(forward: Callable[[], Any], switches: Sequence[Switch], *, margin: float = 0.01,
                   rounds: int = ROUNDS, measure: Measure | None = None, cuda: bool = False) -> list[InModel]:
    """Time `forward` with the picks and with torch's op; keep a pick only where the forward is
    faster with it by more than `margin` in three rounds out of four.  Returns one verdict per
    switch, in order.

    The picks are first tested together: if the forward is not faster with all of them, they all go
    to torch's op.  Otherwise each is tested on its own (the others in place), and a subset that
    survives is tested together once more against torch's op for all of it.  A few percent of
    launch-bound forward time moves between timed blocks, more than one pick's own effect; the
    tests together decide what the model will actually run.

    Example:
        >>> check_in_model(lambda: None, [])
        []
    """
    if not switches:
        return []
    timer: Measure = measure or (lambda fn, n: block_seconds(fn, n, cuda))
    forward()  # first with the picks: patched layers remember the pick's kernel, not a switched entry
    for on in (True, False):  # every path warm: bound launches, allocator, torch's kernels
        for sw in switches:
            sw.library(on)
        forward()
    forward()
    one = max(timer(forward, 1), 1e-6)
    iters = max(1, min(MAX_ITERS, math.ceil(BLOCK_S / one)))

    def test(switch: Any) -> tuple[float, float, bool]:
        return _test(forward, switch, timer, iters, rounds, margin)

    together = test(_Together(switches))
    if not together[2] or len(switches) == 1:
        return [_verdict(sw, together, len(switches) > 1) for sw in switches]
    verdicts = [_verdict(sw, test(sw)) for sw in switches]  # each leaves its switch as decided
    kept = [sw for sw, v in zip(switches, verdicts) if v.kept]
    if kept and len(kept) < len(switches):
        subset = test(_Together(kept))
        if not subset[2]:
            verdicts = [_verdict(sw, subset, True) if v.kept else v for sw, v in zip(switches, verdicts)]
    return verdicts


class _Together:
    """Several switches flipped as one (the picks tested together)."""

    def __init__(self, switches: Sequence[Switch]):
        self.switches = list(switches)

    def library(self, on: bool) -> None:
        for sw in self.switches:
            sw.library(on)


def _test(forward: Callable[[], Any], switch: Any, timer: Measure, iters: int, rounds: int,
          margin: float) -> tuple[float, float, bool]:
    """(median ratio, lower quartile, kept) of torch's op over the pick(s) in interleaved rounds;
    `switch` is left on the verdict's side."""
    ratios = []
    for r in range(rounds):
        times = {}
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            switch.library(on)
            times[on] = timer(forward, iters)
        ratios.append(times[True] / max(times[False], 1e-12))
    q1 = statistics.quantiles(ratios, n=4)[0] if len(ratios) > 1 else ratios[0]
    kept = q1 > 1.0 + margin
    switch.library(not kept)
    return statistics.median(ratios), q1, kept


def _verdict(sw: Switch, result: tuple[float, float, bool], together: bool = False) -> InModel:
    if together:
        sw.library(not result[2])
    ratio, q1, kept = result
    return InModel(sw.selection.problem.describe(), sw.selection.winner.name, ratio, kept, q1, together)
