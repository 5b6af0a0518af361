"""What a timer reads (`Measurement`) and what a timer is (`Timer`): shared by the CPU and CUDA timers.

A timer times a plain function and knows no choice, so its reading is not yet a timing: the runner
that timed a choice makes it one (`Measurement.timing`), and from there every layer (the Bench, the
strategies, the final, the store and the report) holds that one `gemmtune.Timing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from ..core.choices import Choice, Timing

Fn = Callable[[], object]


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

    def timing(self, choice: Choice, stage: str) -> Timing:
        """This reading as `choice`'s timing in `stage`.

        Example:
            >>> t = Measurement(0.030, gpu_ms=0.002, host_ms=0.030).timing(Choice("aten_mm", None), "final")
            >>> t.ms, t.gpu_ms, t.status
            (0.03, 0.002, 'ok')
        """
        return Timing(choice, self.cost_ms, stage, gpu_ms=self.gpu_ms, host_ms=self.host_ms, spread=self.spread)


class Timer(Protocol):
    def time(self, fn: Fn, *, warm: bool = False, stage: str = "final") -> Measurement:
        """Median cost of `fn`; `warm`: it has just run; `stage`: the search stage asking."""

    def time_interleaved(self, fns: Sequence[Fn], rounds: int) -> list[Measurement]:
        """Median cost of each of `fns`, timed round-robin so drift hits all alike."""
