"""Background load while CPU kernels are timed: how many cores other processes kept busy.

On a loaded machine a CPU kernel's threads wait for the scheduler, and every run of a parallel kernel
can read a scheduler tick (4 ms) or two slower: no statistic over such runs gives the kernel's own
time.  So the CPU timer also counts, over the time it spends timing, the busy time of the cores this
process may run on (`/proc/stat`) minus this process's own CPU time (`/proc/self/stat`): the cores
other processes used.  A tune timed while they used more than the cores torch leaves idle is
*provisional*: its pick is stored, marked, and a later run re-checks it (docs/RELIABILITY.md).
Off Linux (no `/proc`) nothing is counted and no verdict is given.

Example:
    >>> other_cores(busy_ticks=300, own_ticks=100, wall_s=1.0, hz=100)  # 3 cores busy, 1 of them ours
    2.0
    >>> loaded(2.0, cpus=2, threads=2), loaded(0.1, cpus=2, threads=2), loaded(1.0, cpus=8, threads=2)
    (True, False, False)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

SPARE = 0.5
"""Cores other processes may use beyond those torch's threads leave idle before the timing counts as loaded."""


def other_cores(busy_ticks: float, own_ticks: float, wall_s: float, hz: float) -> float:
    """Average cores used by other processes: (busy - own) clock ticks over `wall_s` seconds at `hz` ticks/s."""
    if wall_s <= 0 or hz <= 0:
        return 0.0
    return max(0.0, (busy_ticks - own_ticks) / hz / wall_s)


def loaded(cores: float | None, cpus: int, threads: int) -> bool:
    """Whether other processes' `cores` competed with torch's `threads` on this process's `cpus`."""
    return cores is not None and cores > max(0, cpus - threads) + SPARE


def loaded_here(cores: float | None) -> bool:
    """`loaded` on this process's cores at torch's thread count."""
    import torch

    return loaded(cores, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                  torch.get_num_threads())


def background_cores(runner: object) -> float | None:
    """The cores other processes used while `runner`'s CPU timer timed (None: not known, or not a CPU timer).

    Example:
        >>> background_cores(object()) is None
        True
    """
    cores = getattr(getattr(runner, "timer", None), "background_cores", None)
    return cores() if callable(cores) else None


@dataclass(frozen=True)
class Snapshot:
    """Busy ticks of this process's cores, this process's own ticks, and the monotonic time."""

    busy: int
    own: int
    at: float

    @classmethod
    def take(cls) -> "Snapshot | None":
        """Now, or None where /proc cannot be read."""
        try:
            cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}
            busy = 0
            with open("/proc/stat") as f:
                for line in f:
                    name, *ticks = line.split()
                    if name in cpus:  # user nice system idle iowait irq softirq steal ...
                        t = [int(x) for x in ticks[:8]]
                        busy += t[0] + t[1] + t[2] + t[5] + t[6] + t[7]
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
        except (OSError, ValueError, IndexError, AttributeError):
            return None
        return cls(busy, own, time.monotonic())


class LoadMeter:
    """Accumulates other processes' core use over the intervals it is told about (`start` / `stop`).

    Example:
        >>> meter = LoadMeter()
        >>> meter.cores() is None  # nothing measured yet
        True
    """

    def __init__(self) -> None:
        self.busy = self.own = 0
        self.wall = 0.0
        self._started: Snapshot | None = None
        self.hz = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0

    def start(self) -> None:
        self._started = Snapshot.take()

    def stop(self) -> None:
        begin, end = self._started, Snapshot.take()
        self._started = None
        if begin is not None and end is not None:
            self.busy += end.busy - begin.busy
            self.own += end.own - begin.own
            self.wall += end.at - begin.at

    def cores(self) -> float | None:
        """Average cores other processes used while measured; None: nothing measured (or no /proc)."""
        if self.wall < 0.05:  # under 5 ticks at 100 Hz: too short to tell
            return None
        return other_cores(self.busy, self.own, self.wall, self.hz)
