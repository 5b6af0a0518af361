"""One fair timer per device; every timing comes back as a `Measurement`.

The same procedure times every choice, library kernel or template: a tuner can
favour a slower kernel when the two are timed differently (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from .cpu_timer import CpuTimer, relative_spread
from .measurement import Fn, Measurement, Timer

MAX_ROUNDS_FACTOR = 10  # CudaTimer.time_interleaved: at most this many times the rounds asked for
QUEUE_RUNS = 24
"""The most timed runs `CudaTimer` enqueues between two synchronisations.  Each run's flush, events and
kernels wait in the GPU's launch queue; where the GPU falls behind (a covering sleep, a flush and the kernel
outlast the host's launch), that queue fills and a launch then blocks the host until the GPU drains it.  A
host time read then is a share of the GPU's time, not the launch's: readings consistent with that, a call of
four launches 0.111 ms of host time and a one-launch call 0.023 ms (H100, 777x1234x5555, 2026-12-08, before).
A synchronisation after every `QUEUE_RUNS` runs (whole rounds of an interleaved timing) keeps it short."""

__all__ = ["CpuTimer", "CudaTimer", "Fn", "Measurement", "Timer", "planned_runs", "relative_spread", "timer_for"]


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
        """Medians of the GPU and host times, and the spread of the per-run costs (the final's noise)."""
        gpu = statistics.median(g for g, _ in samples)
        host = statistics.median(h for _, h in samples)
        costs = [max(g, h) if self.count_host else g for g, h in samples]
        return Measurement(max(gpu, host) if self.count_host else gpu, gpu, host, spread=relative_spread(costs))

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
            # The GPU needs a head start only where enqueueing a run takes longer than running it.
            per_run_s = (est + self.flush_ms()) * 1e-3
            for start in range(0, max(more, 0), QUEUE_RUNS):  # a short launch queue (`QUEUE_RUNS`)
                runs = range(start, min(more, start + QUEUE_RUNS))
                self._cover_host(len(runs) * max(host_s - per_run_s, 0.0) + 3 * host_s)
                pending = [self._one(fn, k) for k in runs]
                torch.cuda.synchronize(self.device)
                samples += self._collect(pending)
            return self._cost(samples)

    def extra_rounds(self, done: int, spent_s: float, n_fns: int) -> int:
        """Rounds to add after `done` rounds took `spent_s`: fill `rep_ms` per function, at most
        `MAX_ROUNDS_FACTOR` x `done` rounds in all.  Microsecond kernels get hundreds of samples in a
        few milliseconds instead of the fixed count (15 in a tune's final), whose median still moved
        by several percent on 10-20 us kernels (docs/ARCHITECTURE.md).

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
        k = queued = 0
        for r in range(first, last):
            if queued and queued + len(fns) > QUEUE_RUNS:  # a short launch queue (`QUEUE_RUNS`)
                torch.cuda.synchronize(self.device)
                queued = 0
            queued += len(fns)
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
