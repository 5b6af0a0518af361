"""One fair timer per device; every timing comes back as a `Measurement`.

The same procedure times every choice, library kernel or template: a tuner can
favour a slower kernel when the two are timed differently (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

Fn = Callable[[], object]
MAX_ROUNDS_FACTOR = 10  # CudaTimer.time_interleaved: at most this many times the rounds asked for
# CpuTimer (docs/PERFORMANCE.md, "CPU tune time"): prescreening only ranks binaries, so it gets this share
# of `cpu_rep_ms`; a tiny kernel is timed for at most this many runs' worth (400 runs of a 30 us kernel,
# 12 ms, still ten blocks of 40); the finalists' re-time keeps at least this many rounds (spread needs 3);
# a block this long or longer needs no warm-up run before it.
PRESCREEN_SHARE = 0.4
TINY_RUNS = 400
MIN_ROUNDS = 5
WARM_BLOCK_MS = 5.0


@dataclass(frozen=True)
class Measurement:
    """One timer reading.

    `cost_ms` is what the pick compares: on a GPU max(gpu_ms, host_ms) when the host's launch
    time counts (`Settings.count_host_overhead`), else gpu_ms; on CPU the wall time, with
    gpu_ms and host_ms None.

    Example:
        >>> Measurement(0.030, gpu_ms=0.002, host_ms=0.030).cost_ms
        0.03
    """

    cost_ms: float
    gpu_ms: float | None = None  # median CUDA-event time
    host_ms: float | None = None  # median host time to launch one call
    spread: float | None = None  # CPU: interquartile range / median of the samples (None: too few to say)


class Timer(Protocol):
    def time(self, fn: Fn, *, warm: bool = False, stage: str = "final") -> Measurement:
        """Median cost of `fn`; `warm`: it has just run; `stage`: the search stage asking."""

    def time_interleaved(self, fns: Sequence[Fn], rounds: int) -> list[Measurement]:
        """Median cost of each of `fns`, timed round-robin so drift hits all alike."""


class CudaTimer:
    """CUDA events around each run, with the L2 cache flushed before every run.

    `flush="read"` (default) evicts L2 by reading a buffer twice its size; `"write"` zeroes it
    instead, as Triton's do_bench does, which leaves L2 dirty and charges the timed kernel for
    the write-back (gemmtune.core.settings.L2_FLUSH_MODES).

    Example:
        >>> timer = CudaTimer(torch.device("cuda"), rep_ms=20)  # doctest: +SKIP
        >>> timer.time(lambda: torch.mm(a, b))  # doctest: +SKIP
    """

    def __init__(self, device: torch.device, rep_ms: float = 20.0, min_reps: int = 5, max_reps: int = 100,
                 count_host: bool = True, flush: str = "read"):
        self.device, self.rep_ms, self.min_reps, self.max_reps = device, rep_ms, min_reps, max_reps
        # An eager caller pays max(GPU time, host launch time) per call: a kernel
        # whose launcher costs 30 us of Python is no faster in a loop than 30 us,
        # however short it runs on the GPU.  `count_host` makes the timer say so.
        self.count_host = count_host
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
        # Twice the L2's size evicts every line the previous run left there.  float32: a float sum
        # reads at full bandwidth (H200: 37 us for 120 MB); an int32 -> int64 sum took 181 us.
        self._flush = torch.zeros(max(2 * l2, 64 << 20) // 4, dtype=torch.float32, device=device)
        self._sink = torch.zeros((), dtype=torch.float32, device=device)
        if flush not in ("read", "write"):
            raise ValueError(f"CudaTimer: flush must be 'read' or 'write', got {flush!r}")
        self.flush = flush
        self._sleep = getattr(torch.cuda, "_sleep", None)  # a spin kernel of N clock cycles
        self._events: list = []  # reused event pairs: creating two per run cost host time on every run
        self._flush_ms: float | None = None  # GPU time of one flush, measured on first use

    def _cover_host(self, seconds: float) -> None:
        """Keep the GPU busy for about `seconds` while the host enqueues timed runs.

        Without this, a kernel shorter than the host's Python overhead is timed
        with the launch gap inside its events, which penalises whichever
        choice has the longer Python path rather than the slower kernel.
        """
        if self._sleep is not None:
            self._sleep(int(min(seconds * 1.3, 0.05) * 1.98e9))

    @staticmethod
    def _host_s(fn: Fn) -> float:
        """Host seconds to enqueue one run of `fn` (after its warm-up), plus the flush and events."""
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0 + 25e-6

    def _evict(self) -> None:
        """Empty L2 of whatever the previous run left there."""
        if self.flush == "write":
            self._flush.zero_()
        else:
            torch.sum(self._flush, dim=0, out=self._sink)

    def _pair(self, k: int) -> tuple:
        """The k-th pooled (start, end) event pair; free again once the device is synchronised."""
        while len(self._events) <= k:
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        return self._events[k]

    def _one(self, fn: Fn, k: int) -> tuple[int, float]:
        """Enqueue one flushed, timed run on event pair `k`; returns (k, host ms)."""
        start, end = self._pair(k)
        self._evict()
        start.record()
        t0 = time.perf_counter()
        fn()
        host = time.perf_counter() - t0
        end.record()
        return k, host * 1e3

    def _collect(self, pending: Sequence[tuple[int, float]]) -> list[tuple[float, float]]:
        """(GPU ms, host ms) of runs enqueued by `_one`; call after a synchronise (the pairs are then free)."""
        return [(self._events[k][0].elapsed_time(self._events[k][1]), host) for k, host in pending]

    def _cost(self, samples: Sequence[tuple[float, float]]) -> Measurement:
        gpu = statistics.median(g for g, _ in samples)
        host = statistics.median(h for _, h in samples)
        return Measurement(max(gpu, host) if self.count_host else gpu, gpu, host)

    def flush_ms(self) -> float:
        """GPU milliseconds of one L2 flush (measured once): the rep budget counts it."""
        if self._flush_ms is None:
            self._evict()
            start, end = self._pair(0)
            start.record()
            for _ in range(5):
                self._evict()
            end.record()
            torch.cuda.synchronize(self.device)
            self._flush_ms = start.elapsed_time(end) / 5
        return self._flush_ms

    def reps_for(self, est_ms: float) -> int:
        """Timed runs for a kernel of `est_ms`: fill `rep_ms` of GPU time, flushes included.

        Example:
            >>> timer = CudaTimer.__new__(CudaTimer); timer._flush_ms = 0.04
            >>> timer.rep_ms, timer.min_reps, timer.max_reps = 10.0, 5, 50
            >>> timer.reps_for(0.02), timer.reps_for(0.5), timer.reps_for(5.0)
            (50, 18, 5)
        """
        return planned_runs(est_ms, self.flush_ms(), self.rep_ms, self.min_reps, self.max_reps)

    def time(self, fn: Fn, *, warm: bool = False, stage: str = "final") -> Measurement:
        """Median cost of `fn` over `reps_for` flushed runs; the first few (which size the rest) count.
        Every stage gets the same procedure; the warm-up run stays (it also loads the binary lazily)."""
        with torch.cuda.device(self.device):
            fn()  # warm-up: first launch, lazy loading, handle creation
            torch.cuda.synchronize(self.device)
            host_s = self._host_s(fn)
            self.flush_ms()
            torch.cuda.synchronize(self.device)
            first = min(3, self.max_reps)
            self._cover_host(first * host_s)
            pending = [self._one(fn, k) for k in range(first)]
            torch.cuda.synchronize(self.device)
            samples = self._collect(pending)
            est = statistics.median(g for g, _ in samples)
            more = self.reps_for(est) - first
            if more > 0:
                # The GPU needs a head start only where enqueueing a run takes longer than running it.
                per_run_s = (est + self.flush_ms()) * 1e-3
                self._cover_host(more * max(host_s - per_run_s, 0.0) + 3 * host_s)
                pending = [self._one(fn, k) for k in range(more)]
                torch.cuda.synchronize(self.device)
                samples += self._collect(pending)
            return self._cost(samples)

    def extra_rounds(self, done: int, spent_s: float, n_fns: int) -> int:
        """Rounds to add after `done` rounds took `spent_s`: fill `rep_ms` per function, at most
        `MAX_ROUNDS_FACTOR` x `done` rounds in all.  Microsecond kernels get hundreds of samples in a
        few milliseconds instead of the fixed count (15 in a tune's final), whose median still moved
        by several percent on 10-20 us kernels (docs/PERFORMANCE.md, run D).

        Example:
            >>> timer = CudaTimer.__new__(CudaTimer); timer.rep_ms = 10.0
            >>> timer.extra_rounds(15, 0.003, 4), timer.extra_rounds(15, 0.084, 4)
            (135, 0)
        """
        budget_s = self.rep_ms * 1e-3 * n_fns
        if done <= 0 or spent_s >= budget_s:
            return 0
        per_round = max(spent_s / done, 1e-9)
        return int(min(done * (MAX_ROUNDS_FACTOR - 1), (budget_s - spent_s) / per_round))

    def _rounds(self, fns: Sequence[Fn], first: int, last: int, round_s: float) -> list[list[tuple[int, float]]]:
        """Enqueue rounds `first`..`last`; per function, its (event pair, host ms) runs."""
        order = list(range(len(fns)))
        pending: list[list[tuple[int, float]]] = [[] for _ in fns]
        k = 0
        for r in range(first, last):
            self._cover_host(round_s)  # per round: the GPU never waits for the host inside a round
            # Rotate the order each round so no choice always runs first.
            for i in order[r % len(fns):] + order[: r % len(fns)]:
                pending[i].append(self._one(fns[i], k))
                k += 1
        return pending

    def time_interleaved(self, fns: Sequence[Fn], rounds: int) -> list[Measurement]:
        """At least `rounds` rounds (every function once per round, rotated order), then more while
        the call has used less than `rep_ms` per function (`extra_rounds`)."""
        with torch.cuda.device(self.device):
            for fn in fns:
                fn()
            torch.cuda.synchronize(self.device)
            round_s = sum(self._host_s(fn) for fn in fns)
            torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            pending = self._rounds(fns, 0, rounds, round_s)
            torch.cuda.synchronize(self.device)
            samples = [self._collect(p) for p in pending]
            extra = self.extra_rounds(rounds, time.perf_counter() - t0, len(fns))
            if extra:
                pending = self._rounds(fns, rounds, rounds + extra, round_s)
                torch.cuda.synchronize(self.device)
                for mine, more in zip(samples, pending):
                    mine += self._collect(more)
            return [self._cost(mine) for mine in samples]


class CpuTimer:
    """`torch.utils.benchmark.Timer.blocked_autorange` per choice: blocks of runs for a budget of at most
    `rep_ms`, the median time per run across blocks and its relative spread (IQR / median).

    A loaded machine shows up as spread, not as a confident time: a thread descheduled for a
    scheduler tick adds 4 ms to whichever run it hits, and the blocks that caught one lie far from
    the rest.  The timer runs at torch's current thread count (Timer's default, one thread, would
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


def timer_for(device: str, settings) -> Timer:
    """The timer for `device` ('cpu' or 'cuda:N'), configured by `settings`.

    Example:
        >>> import gemmtune
        >>> type(timer_for("cpu", gemmtune.Settings())).__name__
        'CpuTimer'
    """
    if device.startswith("cuda"):
        return CudaTimer(torch.device(device), settings.gpu_rep_ms, settings.min_reps, settings.max_reps,
                         count_host=settings.count_host_overhead, flush=settings.l2_flush)
    return CpuTimer(settings.cpu_rep_ms, min(settings.min_reps, 3), settings.max_reps)


def planned_runs(kernel_ms: float, flush_ms: float, rep_ms: float, min_reps: int, max_reps: int) -> int:
    """Timed runs `CudaTimer` gives a kernel of `kernel_ms`: enough to fill `rep_ms` of GPU time, each
    run paying one L2 flush of `flush_ms`, within `min_reps`..`max_reps`.  `gemmtune simulate`
    estimates tuning time with the same rule.

    Example:
        >>> [planned_runs(ms, 0.04, 10.0, 5, 50) for ms in (0.02, 0.5, 5.0)]
        [50, 18, 5]
    """
    return int(min(max_reps, max(min_reps, rep_ms / max(kernel_ms + flush_ms, 1e-3))))
