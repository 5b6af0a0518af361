"""The second timer: an independent reading for a close call between a generated kernel and the library's.

The first timer (`timers.CudaTimer`) times each run between CUDA events after evicting L2 by reading a
buffer, and counts the host's launch time.  Two timers can rank near-equal kernels differently: a
memory-bound kernel meets L2 in another state, a launch overlaps differently.  Where the final's pick is
a generated kernel within `Settings.second_timer_band` of the library kernel, a second timer built
another way reads both again, and the generated kernel stands only if it also wins there by the
library margin (`search.final`):

- `do_bench` (the default, where the first timer reads to flush): Triton's `triton.testing.do_bench`, which
  zeroes a 256 MB buffer before each run, leaving L2 full of dirty lines the timed kernel must write back;
- `cuda_graph` (where the first timer already zeroes, `l2_flush="write"`): `triton.testing.do_bench_cudagraph`,
  runs replayed back to back from a CUDA graph, no flush and no host launch in the reading.

Each kernel is read `ROUNDS` times, in alternating order, and its median taken.

Example:
    >>> second_timer_for("read"), second_timer_for("write")
    ('do_bench', 'cuda_graph')
"""

from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch

SECOND_TIMERS = ("do_bench", "cuda_graph")
ROUNDS = 3  # readings of each kernel, in alternating order
REP_MS = 10.0  # each reading's measuring window (Triton's `rep`)
WARMUP_MS = 2.0


def second_timer_for(first_flush: str) -> str:
    """The second timer for a first timer that evicts L2 by `first_flush` ("read" or "write"): the other kind."""
    return "cuda_graph" if first_flush == "write" else "do_bench"


def second_reading(fns: Sequence[Callable[[], object]], timer: str, device: torch.device,
                   rounds: int = ROUNDS) -> list[float]:
    """Milliseconds per call of each of `fns` under `timer` (`SECOND_TIMERS`): the median of `rounds`
    readings, taken in alternating order so drift meets every kernel alike."""
    if timer not in SECOND_TIMERS:
        raise ValueError(f"second timer: expected one of {', '.join(SECOND_TIMERS)}, got {timer!r}")
    from triton.testing import do_bench, do_bench_cudagraph

    def read(fn: Callable[[], object]) -> float:
        if timer == "cuda_graph":
            return float(do_bench_cudagraph(fn, rep=REP_MS, return_mode="median"))
        return float(do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))

    readings: list[list[float]] = [[] for _ in fns]
    with torch.cuda.device(device):
        for r in range(rounds):
            order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
            for i in order:
                readings[i].append(read(fns[i]))
    return [statistics.median(mine) for mine in readings]
