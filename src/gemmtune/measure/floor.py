"""A CPU reading's floor: the least time a GEMM can take on this machine, from its work and the
machine's measured peak.

Other processes are not the only thing that slows a timing: a container's CPU quota, a throttled core
or a neighbour /proc cannot see can stretch every reading alike, so their spread stays small and they
look clean.  A library kernel (torch's own op) runs close to the machine's peak, so when its reading is
far above the floor of its problem -- its FLOPs at the measured FLOP rate, or its bytes at the measured
copy rate, plus one call's overhead -- the readings of that tune are not the kernels' own times, and
the tune decides as on a busy machine (`pipeline.steps.busy_decision`).

The peak is measured once per process, on first need (about 40 ms on a quiet machine): the best of
40 torch.mm of 256^3 float32, of 10 copies of 16 MiB, and of 200 1x1x1 mm (the call's overhead).
Measured on a busy machine the peak reads low and the floor high, so the check misses more, never
flags more.

Example:
    >>> work = Work(flops=2 * 64 ** 3, bytes=3 * 64 * 64 * 4)
    >>> peak = Peak(flops_per_s=1e11, bytes_per_s=1e10, call_s=2e-6)
    >>> round(floor_ms(work, peak), 4)
    0.0072
    >>> far_above(0.05, work, peak), far_above(5.0, work, peak)
    (False, True)
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

FLOOR_FACTOR = 20.0
"""A library kernel's reading above this many times its floor is not the kernel's own time."""


@dataclass(frozen=True)
class Work:
    """The floating-point operations and the bytes moved (operands read, output written) of one call."""

    flops: float
    bytes: float

    @classmethod
    def of(cls, ki) -> "Work":
        """The work of a `KernelInputs` problem (`batch` x 2MNK FLOPs; A, B and C once each).

        Example:
            >>> import torch
            >>> from gemmtune.core.inputs import KernelInputs
            >>> Work.of(KernelInputs.from_tensors("mm", torch.randn(8, 4), torch.randn(4, 2)))
            Work(flops=128.0, bytes=224.0)
        """
        batch = ki.operands[-1].size[0] if ki.op == "bmm" else 1
        size = ki.operands[-1].dtype.itemsize
        return cls(2.0 * batch * ki.M * ki.N * ki.K, float(batch * (ki.M * ki.K + ki.K * ki.N + ki.M * ki.N) * size))


@dataclass(frozen=True)
class Peak:
    """The machine's measured FLOP rate, copy rate and one GEMM call's overhead, in seconds."""

    flops_per_s: float
    bytes_per_s: float
    call_s: float


def floor_ms(work: Work, peak: Peak) -> float:
    """The least time `work` can take at `peak`, in ms."""
    return 1e3 * (peak.call_s + max(work.flops / peak.flops_per_s, work.bytes / peak.bytes_per_s))


def far_above(ms: float | None, work: Work, peak: "Peak | None" = None) -> bool:
    """Whether a library kernel's reading of `ms` is more than `FLOOR_FACTOR` times the floor of `work`
    (None: the machine's peak, measured once)."""
    if ms is None:
        return False
    return ms > FLOOR_FACTOR * floor_ms(work, peak or machine_peak())


def _best_s(fn, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@functools.lru_cache(maxsize=1)
def machine_peak() -> Peak:
    """This machine's `Peak`, measured on first call with torch's own CPU kernels."""
    import torch

    a = torch.randn(256, 256)
    src, dst = torch.randn(4 << 20), torch.empty(4 << 20)  # 16 MiB of float32 each
    tiny = torch.randn(1, 1)
    torch.mm(a, a), dst.copy_(src), torch.mm(tiny, tiny)  # warm
    flops = 2 * 256 ** 3 / _best_s(lambda: torch.mm(a, a), 40)
    copy = 2 * src.numel() * 4 / _best_s(lambda: dst.copy_(src), 10)  # read and write
    return Peak(flops, copy, _best_s(lambda: torch.mm(tiny, tiny), 200))
