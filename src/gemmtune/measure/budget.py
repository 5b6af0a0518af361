"""One budget for a tune: benchmark runs and wall-clock seconds, with the compile and re-time deadlines.

A `Bench` enforces it where measuring happens (`Bench.measure` answers None past it); the engine
asks it when compiles must stop and whether the final's re-time still fits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """At most `runs` distinct choices measured, and at most `seconds` from `started` (a
    `time.perf_counter()` value); None: unlimited.

    Under a time budget compiles stop early, `compile_share` of the budget before its end, for the
    library kernels (the safety net) timed after them; the final's interleaved re-time runs only
    while `retime_s` seconds are left.

    Example:
        >>> b = Budget(seconds=10.0, started=100.0, compile_share=0.3)
        >>> b.deadline, b.compile_deadline, Budget().deadline, Budget(runs=3).limited
        (110.0, 107.0, None, True)
    """

    runs: int | None = None
    seconds: float | None = None
    started: float = 0.0
    compile_share: float = 0.1
    retime_s: float = 0.0

    def __post_init__(self) -> None:
        if self.runs is not None and self.runs < 0:
            raise ValueError(f"budget: runs must be >= 0, got {self.runs}")

    @property
    def limited(self) -> bool:
        """A budget of runs or of seconds is set (library kernels are then timed first)."""
        return self.runs is not None or self.deadline is not None

    @property
    def deadline(self) -> float | None:
        """The `time.perf_counter()` value after which nothing more is timed (None: no time budget)."""
        return self.started + self.seconds if self.seconds else None

    @property
    def compile_deadline(self) -> float | None:
        """When pending compiles are abandoned (None: no time budget)."""
        deadline = self.deadline
        return None if deadline is None or self.seconds is None else deadline - self.compile_share * self.seconds

    def time_left(self) -> float:
        """Seconds until the deadline (infinite without one)."""
        deadline = self.deadline
        return float("inf") if deadline is None else deadline - time.perf_counter()

    def out_of_time(self, next_s: float) -> bool:
        """A step taking `next_s` seconds would end past the deadline."""
        return self.time_left() < next_s

    def room_for_retime(self) -> bool:
        """The final's interleaved re-time still fits before the deadline."""
        return not self.out_of_time(self.retime_s)

    def within_runs(self, counted: int, more: int) -> bool:
        """`more` runs may follow `counted` ones."""
        return self.runs is None or counted + more <= self.runs
