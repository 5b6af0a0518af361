"""One fair timer per device.

The same procedure times every choice, library kernel or template: FACTS.md
shows a tuner can favour a slower kernel when the two are timed differently.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Protocol, Sequence

import torch

Fn = Callable[[], object]
MAX_ROUNDS_FACTOR = 10  # CudaTimer.time_interleaved: at most this many times the rounds asked for


class Timer(Protocol):
    def time(self, fn: Fn) -> float:
        """Median milliseconds of `fn`."""

    def time_interleaved(self, fns: Sequence[Fn], rounds: int) -> list[float]:
        """Median milliseconds of each of `fns`, timed round-robin so drift hits all alike."""


class CudaTimer:
    """CUDA events around each run, with the L2 cache flushed before every run.

    `flush="read"` (default) evicts L2 by reading a buffer twice its size; `"write"` zeroes it
    instead, as Triton's do_bench does, which leaves L2 dirty and charges the timed kernel for
    the write-back (gemmtune.settings.L2_FLUSH_MODES).

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
        self.last: tuple[float, float] = (0.0, 0.0)  # (GPU ms, host ms) of the last time()
        self.last_all: list[tuple[float, float]] = []  # the same per function of the last time_interleaved()
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
        # Writing twice the L2's size evicts every line the previous run left there.
        self._flush = torch.zeros(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
        self._sink = torch.zeros((), dtype=torch.int64, device=device)
        if flush not in ("read", "write"):
            raise ValueError(f"CudaTimer: flush must be 'read' or 'write', got {flush!r}")
        self.flush = flush
        self._sleep = getattr(torch.cuda, "_sleep", None)  # a spin kernel of N clock cycles

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
        return time.perf_counter() - t0 + 15e-6

    def _evict(self) -> None:
        """Empty L2 of whatever the previous run left there."""
        if self.flush == "write":
            self._flush.zero_()
        else:
            torch.sum(self._flush, dim=0, dtype=torch.int64, out=self._sink)

    def _one(self, fn: Fn) -> tuple[torch.cuda.Event, torch.cuda.Event, float]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._evict()
        start.record()
        t0 = time.perf_counter()
        fn()
        host = time.perf_counter() - t0
        end.record()
        return start, end, host * 1e3

    def _cost(self, events: Sequence[tuple]) -> float:
        gpu = statistics.median(s.elapsed_time(e) for s, e, _ in events)
        host = statistics.median(h for _, _, h in events)
        self.last = (gpu, host)
        return max(gpu, host) if self.count_host else gpu

    def _reps(self, fn: Fn, host_s: float) -> int:
        # Estimate: 3 flushed runs, then enough reps to fill rep_ms.
        self._cover_host(3 * host_s)
        events = [self._one(fn) for _ in range(3)]
        torch.cuda.synchronize(self.device)
        est = statistics.median(s.elapsed_time(e) for s, e, _ in events)
        return int(min(self.max_reps, max(self.min_reps, self.rep_ms / max(est, 1e-3))))

    def time(self, fn: Fn) -> float:
        with torch.cuda.device(self.device):
            fn()  # warm-up: first launch, lazy loading, handle creation
            torch.cuda.synchronize(self.device)
            host_s = self._host_s(fn)
            torch.cuda.synchronize(self.device)
            reps = self._reps(fn, host_s)
            self._cover_host(reps * host_s)
            events = [self._one(fn) for _ in range(reps)]
            torch.cuda.synchronize(self.device)
            return self._cost(events)

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

    def _rounds(self, fns: Sequence[Fn], events: list[list], first: int, last: int, round_s: float) -> None:
        order = list(range(len(fns)))
        for r in range(first, last):
            self._cover_host(round_s)  # per round: the GPU never waits for the host inside a round
            # Rotate the order each round so no choice always runs first.
            for i in order[r % len(fns):] + order[: r % len(fns)]:
                events[i].append(self._one(fns[i]))

    def time_interleaved(self, fns: Sequence[Fn], rounds: int) -> list[float]:
        """At least `rounds` rounds (every function once per round, rotated order), then more while
        the call has used less than `rep_ms` per function (`extra_rounds`)."""
        with torch.cuda.device(self.device):
            for fn in fns:
                fn()
            torch.cuda.synchronize(self.device)
            round_s = sum(self._host_s(fn) for fn in fns)
            torch.cuda.synchronize(self.device)
            events: list[list] = [[] for _ in fns]
            t0 = time.perf_counter()
            self._rounds(fns, events, 0, rounds, round_s)
            torch.cuda.synchronize(self.device)
            extra = self.extra_rounds(rounds, time.perf_counter() - t0, len(fns))
            if extra:
                self._rounds(fns, events, rounds, rounds + extra, round_s)
                torch.cuda.synchronize(self.device)
            costs = []
            self.last_all = []
            for evs in events:
                costs.append(self._cost(evs))
                self.last_all.append(self.last)
            return costs


class CpuTimer:
    """Wall clock around each run after a warm-up run; median of the runs."""

    def __init__(self, rep_ms: float = 200.0, min_reps: int = 3, max_reps: int = 50):
        self.rep_ms, self.min_reps, self.max_reps = rep_ms, min_reps, max_reps

    @staticmethod
    def _one(fn: Fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def time(self, fn: Fn) -> float:
        fn()  # warm-up: JIT dispatch, page faults, thread-pool start
        est = self._one(fn)
        reps = int(min(self.max_reps, max(self.min_reps, self.rep_ms / max(est, 1e-3))))
        return statistics.median([est] + [self._one(fn) for _ in range(reps - 1)])

    def time_interleaved(self, fns: Sequence[Fn], rounds: int) -> list[float]:
        # Each round runs every choice as a short block whose first run is
        # discarded: switching between libraries (torch's OpenMP pool, NumPy's
        # BLAS pool, numba's) costs the first call of a block a thread hand-over
        # that no user calling one kernel repeatedly ever pays.
        samples: list[list[float]] = [[] for _ in fns]
        for r in range(rounds):
            for k in range(len(fns)):
                i = (k + r) % len(fns)
                fns[i]()
                samples[i].extend(self._one(fns[i]) for _ in range(2))
        return [statistics.median(s) for s in samples]


def timer_for(device: str, settings) -> Timer:
    """The timer for `device` ('cpu' or 'cuda:N'), configured by `settings`."""
    if device.startswith("cuda"):
        return CudaTimer(torch.device(device), settings.gpu_rep_ms, settings.min_reps, settings.max_reps,
                         count_host=settings.count_host_overhead, flush=settings.l2_flush)
    return CpuTimer(settings.cpu_rep_ms, min(settings.min_reps, 3), settings.max_reps)
