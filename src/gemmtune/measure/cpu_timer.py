"""The CPU timer: `torch.utils.benchmark`'s blocked autorange per choice, interleaved rounds for the
finalists, and the background load while it times (`measure.load`)."""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from .load import LoadMeter
from .measurement import Fn, Measurement

# CpuTimer (docs/ARCHITECTURE.md, "The timer and fairness"): prescreening only ranks binaries, so it gets this share
# of `cpu_rep_ms`; a tiny kernel is timed for at most this many runs' worth (400 runs of a 30 us kernel,
# 12 ms, still ten blocks of 40); the finalists' re-time keeps at least this many rounds (spread needs 3);
# a block this long or longer needs no warm-up run before it.
PRESCREEN_SHARE = 0.4
TINY_RUNS = 400
MIN_ROUNDS = 5
WARM_BLOCK_MS = 5.0


class CpuTimer:
    """`torch.utils.benchmark.Timer.blocked_autorange` per choice: blocks of runs for a budget of at most
    `rep_ms`, the median time per run across blocks and its relative spread (IQR / median).

    A loaded machine shows up as spread, not as a confident time: a thread descheduled for a
    scheduler tick adds 4 ms to whichever run it hits, and the blocks that caught one lie far from
    the rest.  Where other processes keep the cores busy every run can be hit; the timer counts
    their core use while it times (`background_cores`, `measure.load`), and such a tune is provisional.  The timer runs at torch's current thread count (Timer's default, one thread, would
    handicap the library kernel against numba's thread pool).

    The budget is scaled to the work (`budget_ms`): a tiny kernel gets `TINY_RUNS` runs' worth of
    time (at least a fifth of `rep_ms`), prescreening (which only ranks binaries) `PRESCREEN_SHARE`
    of it; a kernel slower than a tenth of the budget runs one at a time, its sizing run counted.

    Example:
        >>> m = CpuTimer(rep_ms=5.0).time(lambda: sum(range(1000)))
        >>> m.cost_ms > 0, m.gpu_ms, m.spread is None or m.spread >= 0
        (True, None, True)
    """

    def __init__(self, rep_ms: float = 200.0, min_reps: int = 3, max_reps: int = 50, cut_factor: float = 3.0):
        self.rep_ms, self.min_reps, self.max_reps = rep_ms, min_reps, max_reps
        # A function whose first two runs both take more than `cut_factor` times the fastest median
        # this timer has measured (one timer per problem) is losing: its faster run is its time,
        # without the full budget (slow numba tiles on 1024^3 cost ~60 ms a run).  Noise only adds.
        self.cut_factor, self.best_ms = cut_factor, float("inf")
        self.load = LoadMeter()  # other processes' core use while this timer times (`background_cores`)

    def background_cores(self) -> float | None:
        """Average cores other processes used while this timer was timing (None: unknown, too short)."""
        return self.load.cores()

    @staticmethod
    def _timer(fn: Fn):
        from torch.utils import benchmark

        return benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())

    def budget_ms(self, first_ms: float, stage: str = "final") -> float:
        """Time to spend on a function whose one run took `first_ms`: `rep_ms` (times `PRESCREEN_SHARE`
        in prescreening), capped at `TINY_RUNS` runs but not under a fifth of it.

        Example:
            >>> t = CpuTimer(rep_ms=50.0)
            >>> t.budget_ms(0.01), t.budget_ms(1.0), t.budget_ms(1.0, "prescreen"), t.budget_ms(30.0)
            (10.0, 50.0, 20.0, 50.0)
        """
        rep = self.rep_ms * (PRESCREEN_SHARE if stage == "prescreen" else 1.0)
        return max(rep / 5, min(rep, TINY_RUNS * first_ms))

    def time(self, fn: Fn, *, warm: bool = False, stage: str = "final") -> Measurement:
        """Median per-run time of `fn` over about `budget_ms` of blocks, about ten blocks of runs.

        `warm`: `fn` has just run (the correctness check), so no warm-up run.  Timer's own block
        sizing grows the block ten-fold until one block is long enough, which can overshoot the
        budget tenfold; here one timed run sizes the blocks instead (`_block`), so the budget holds.
        """
        self.load.start()
        try:
            return self._time(fn, warm, stage)
        finally:
            self.load.stop()

    def _time(self, fn: Fn, warm: bool, stage: str) -> Measurement:
        first = self._first_run(fn, warm)
        budget = self.budget_ms(first, stage)
        number = max(1, min(1000, int(budget / 10 / max(first, 1e-4))))
        if number == 1:
            return self._one_at_a_time(fn, first, budget)
        timer = self._timer(fn)
        timer._estimate_block_size = lambda min_run_time: number  # blocked_autorange's sizing step
        m = timer.blocked_autorange(min_run_time=budget * 1e-3)
        self.best_ms = min(self.best_ms, m.median * 1e3)
        return Measurement(m.median * 1e3, spread=relative_spread(m.times))

    def _one_at_a_time(self, fn: Fn, first: float, budget: float) -> Measurement:
        """A slow function: single runs until the budget is spent, the sizing run the first sample; cut
        short when its first two runs both lose by `cut_factor` (see __init__)."""
        samples = [first]
        while sum(samples) < budget and len(samples) < self.max_reps:
            samples.append(self._run(fn, 1))
            if len(samples) == 2 and min(samples) > self.cut_factor * self.best_ms:
                return Measurement(min(samples))
        median = statistics.median(samples)
        self.best_ms = min(self.best_ms, median)
        return Measurement(median, spread=relative_spread(samples))

    def time_interleaved(self, fns: Sequence[Fn], rounds: int) -> list[Measurement]:
        """Every function once per round as one block, rotated order; median and spread over the rounds.
        Blocks are sized so that all rounds take about `rep_ms` per function (the full budget, tiny
        kernels too: this decides the pick and its noise verdict); where even one run per round would
        overrun that, fewer rounds (at least `MIN_ROUNDS`)."""
        self.load.start()
        try:
            return self._interleaved(fns, rounds)
        finally:
            self.load.stop()

    def _interleaved(self, fns: Sequence[Fn], rounds: int) -> list[Measurement]:
        firsts = [self._first_run(fn, True) for fn in fns]  # finalists have run already: sizing needs no warm-up
        budgets = [self.rep_ms for _ in firsts]
        rounds = max(min(rounds, MIN_ROUNDS), min(rounds, int(min(b / f for b, f in zip(budgets, firsts)))))
        numbers = [max(1, min(1000, int(b / rounds / max(f, 1e-4)))) for b, f in zip(budgets, firsts)]
        # A warm-up run per block: switching between libraries (torch's OpenMP pool, NumPy's BLAS
        # pool, numba's) costs a block's first call a thread hand-over that no user calling one
        # kernel repeatedly ever pays; against a block of WARM_BLOCK_MS or more that is lost in the noise.
        warm = [n * f < WARM_BLOCK_MS for n, f in zip(numbers, firsts)]
        # Slow kernels only (blocks of one run): each sizing run is a first sample, one round fewer.
        seeded = all(n == 1 for n in numbers) and rounds > 1
        samples: list[list[float]] = [[f] if seeded else [] for f in firsts]
        for r in range(1 if seeded else 0, rounds):
            for k in range(len(fns)):
                i = (k + r) % len(fns)
                if warm[i]:
                    fns[i]()
                samples[i].append(self._run(fns[i], numbers[i]))
        return [Measurement(statistics.median(s), spread=relative_spread(s)) for s in samples]

    @staticmethod
    def _run(fn: Fn, number: int) -> float:
        """Mean milliseconds per run over a block of `number` runs."""
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) * 1e3 / number

    def _first_run(self, fn: Fn, warm: bool) -> float:
        """Milliseconds of one timed run of `fn`, after a warm-up run unless it is `warm` already."""
        if not warm:
            fn()
        return self._run(fn, 1)


def relative_spread(samples: Sequence[float]) -> float | None:
    """Interquartile range over median of `samples`; None under 3 samples (too few to tell noise).

    Example:
        >>> relative_spread([1.0, 1.0, 1.0, 1.0]), relative_spread([1.0, 2.0]), round(relative_spread([8, 10, 12, 16, 20]), 2)
        (0.0, None, 0.5)
    """
    if len(samples) < 3:
        return None
    q = statistics.quantiles(samples, n=4, method="inclusive")
    med = statistics.median(samples)
    return (q[2] - q[0]) / med if med > 0 else None
