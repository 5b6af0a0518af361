"""A runner that answers from recorded timings: tests, and replaying a tune or a sweep without a device."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence, Union

from ..core.choices import Choice, Timing
from .compile import CompileResult
from .runners import RunFailed
from .timers import Measurement

RecordedTime = Union[Timing, Measurement, float]


class ReplayRunner:
    """Answers `check` and `time` from recorded timings, keyed by `Choice.key`; runs nothing.

    `recorded` is a mapping from choice keys to a time in ms, a Measurement or a Timing, or an
    iterable of Timings (e.g. a Selection's `timings`).  A recorded failure replays as that
    failure; a choice with no record replays as `run_failed`.  Interleaved re-timing answers
    the same recorded values, so a replayed tune reaches the same final numbers.

    Example:
        >>> c = Choice("triton_mm", "ab12")
        >>> runner = ReplayRunner({c.key: Measurement(0.5, gpu_ms=0.5, host_ms=0.01)})
        >>> t = runner.time(c, "final", check=True)
        >>> t.ms, t.gpu_ms, runner.time(Choice("other", "cd34"), "final", check=True).status
        (0.5, 0.5, 'run_failed')
    """

    isolation = "replay"

    def __init__(self, recorded: Mapping[str, RecordedTime] | Iterable[Timing]):
        items = recorded.items() if isinstance(recorded, Mapping) else ((t.choice.key, t) for t in recorded)
        self.recorded: dict[str, Timing | Measurement] = {
            key: Measurement(float(v)) if isinstance(v, (int, float)) else v for key, v in items}
        self.asked: list[Choice] = []  # every choice a check or timing was asked for, in order

    def check(self, choice: Choice) -> str | None:
        self.asked.append(choice)
        rec = self.recorded.get(choice.key)
        if rec is None:  # nothing recorded ran: a pinned choice without a record does not pass
            return "no recorded timing to replay"
        return rec.detail if isinstance(rec, Timing) and rec.status == "wrong_result" else None

    def time(self, choice: Choice, stage: str, *, check: bool) -> Timing:
        self.asked.append(choice)
        rec = self.recorded.get(choice.key)
        if rec is None:
            return Timing(choice, None, stage, "run_failed", "no recorded timing to replay")
        if isinstance(rec, Timing) and (rec.status != "ok" or rec.ms is None):
            return Timing(choice, None, stage, rec.status if rec.status != "ok" else "run_failed", rec.detail)
        return _replayed(rec, choice, stage)

    def time_interleaved(self, choices: Sequence[Choice], rounds: int) -> list[Timing]:
        self.asked.extend(choices)
        missing = [c.key for c in choices if self.recorded.get(c.key) is None]
        if missing:
            raise RunFailed(f"no recorded timing to replay for {', '.join(missing)}")
        return [_replayed(self.recorded[c.key], c, "finalist") for c in choices]

    def second_opinion(self, choices: Sequence[Choice]) -> tuple[str, list[float]] | None:
        return None  # recorded times have no second reading

    def close(self) -> None:
        """Nothing to release."""


class ReplayCompiled(CompileResult):
    """The compile step of a replay: nothing is built; the choices "built" may run (their recorded
    times answer), as the binaries a live tune compiled.

    Example:
        >>> built = ReplayCompiled([Choice("triton_mm", "ab12")])
        >>> built.may_run(Choice("triton_mm", "ab12")), built.may_run(Choice("triton_mm", "cd34"))
        (True, False)
    """

    def __init__(self, built: Iterable[Choice] = ()):
        super().__init__()
        self.built = {c.binary_key for c in built}

    def may_run(self, choice: Choice) -> bool:
        return choice.binary_key in self.built


def _replayed(rec: Timing | Measurement, choice: Choice, stage: str) -> Timing:
    """A recorded reading or timing as `choice`'s timing in `stage` (a recorded failure: inf)."""
    if isinstance(rec, Measurement):
        return rec.timing(choice, stage)
    ms = rec.ms if rec.ms is not None else float("inf")
    return Timing(choice, ms, stage, gpu_ms=rec.gpu_ms, host_ms=rec.host_ms, spread=rec.spread)
