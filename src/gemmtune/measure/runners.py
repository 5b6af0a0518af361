"""Runners: where a check or a timing runs.

A `Bench` decides what to measure and keeps the records; a runner only runs
what it is asked to.  `LocalRunner` runs in this process; the subprocess
runner (`gemmtune.measure.isolation.SubprocessRunner`) sends the same work to a
worker process, which runs it with a LocalRunner of its own; `ReplayRunner`
(`gemmtune.measure.replay`) answers from recorded timings.  `runner_for`
(`gemmtune.measure.factory`) picks one from `Settings.isolation`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol, Sequence

import torch

from ..core.choices import Choice, Timing
from ..core.inputs import KernelInputs
from ..core.layout import empty_output
from ..templates import staging
from ..templates.base import Launcher
from .correctness import Reference, verdict
from .second import second_reading, second_timer_for
from .timers import Timer, timer_for


class RunFailed(RuntimeError):
    """The runner could not answer at all (as opposed to a choice that failed): e.g. its worker was lost."""


class Runner(Protocol):
    """What a Bench needs from a place that runs candidates."""

    isolation: str  # Selection.isolation: "off" (this process), "subprocess" or "replay"

    def check(self, choice: Choice) -> str | None:
        """Correctness only: None when `choice` matches the reference, else why not."""

    def time(self, choice: Choice, stage: str, *, check: bool) -> Timing:
        """Check `choice` first (when `check`), then time it; failures come back as a Timing's status."""

    def time_interleaved(self, choices: Sequence[Choice], rounds: int) -> list[Timing]:
        """Re-time `choices` round-robin (stage "finalist"); raises RunFailed when that cannot be done."""

    def second_opinion(self, choices: Sequence[Choice]) -> tuple[str, list[float]] | None:
        """(the second timer's name, ms per choice) from an independent timer (`measure.second`); None
        where there is none (off a GPU, a replay)."""

    def close(self) -> None:
        """Release what the runner holds (a worker goes back to the pool)."""


class LocalRunner:
    """Checks and times candidates in this process.

    Each choice is checked on an output poisoned with NaN, so elements it never writes show.

    Example:
        >>> import torch
        >>> from gemmtune.core.inputs import KernelInputs
        >>> from gemmtune.measure.timers import CpuTimer
        >>> a, b = torch.randn(8, 4), torch.randn(4, 6)
        >>> ki = KernelInputs.from_tensors("mm", a, b)
        >>> runner = LocalRunner(ki, (a, b), lambda c: lambda t, out: torch.mm(*t, out=out),
        ...                      CpuTimer(rep_ms=1), lambda: torch.empty(8, 6))
        >>> c = Choice("aten_mm", None)
        >>> runner.check(c) is None, runner.time(c, "final", check=True).status
        (True, 'ok')
    """

    isolation = "off"

    def __init__(self, ki: KernelInputs, tensors: Sequence[torch.Tensor], launchers: Callable[[Choice], Launcher],
                 timer: Timer, out_factory: Callable[[], torch.Tensor], padded_rows: bool = False):
        self.ki, self.tensors, self.launchers, self.timer = ki, tuple(tensors), launchers, timer
        self.out_factory, self.padded_rows = out_factory, padded_rows  # out_layout="padded": a twin's own rows
        self._out: torch.Tensor | None = None  # one output buffer, reused by every choice
        self._ref: Reference | None = None  # computed once per problem
        self._fns: dict[Choice, Callable[[], Any]] = {}  # each choice's call (`_fn`)

    def check(self, choice: Choice) -> str | None:
        return self._check(self._fn(choice))

    def time(self, choice: Choice, stage: str, *, check: bool) -> Timing:
        try:
            fn = self._fn(choice)
            if check:
                problem = self._check(fn)
                if problem:
                    return Timing(choice, None, stage, "wrong_result", problem)
            m = self.timer.time(fn, warm=check, stage=stage)  # the check's run was the warm-up
        except Exception as exc:  # a launch failure excludes the choice, not the tuning
            return Timing(choice, None, stage, "run_failed", f"{type(exc).__name__}: {str(exc).strip()[:200]}")
        return m.timing(choice, stage)

    def time_interleaved(self, choices: Sequence[Choice], rounds: int) -> list[Timing]:
        readings = self.timer.time_interleaved([self._fn(c) for c in choices], rounds)
        return [m.timing(c, "finalist") for c, m in zip(choices, readings)]

    def second_opinion(self, choices: Sequence[Choice]) -> tuple[str, list[float]] | None:
        flush = getattr(self.timer, "flush", None)
        if flush is None or not self.ki.device_type == "cuda":
            return None
        timer = second_timer_for(flush)
        return timer, second_reading([self._fn(c) for c in choices], timer, torch.device(self.ki.device))

    def close(self) -> None:
        self._out = self._ref = None
        self._fns.clear()
        staging.forget(threading.get_ident())  # the storage this thread's padded twins kept while timed

    def _fn(self, choice: Choice) -> Callable[[], Any]:
        """One call of `choice` as the eager dispatch makes it: through its launcher's binding to this
        problem (`launch.bound`, core/binding.py) where it has one and the output is row-major, so the
        check reads that path and the host time is the one a warm call pays; a padded twin's own padded
        rows (`launch.padded_rows`) where the output's rows are padded; else its launcher.  Made once per
        choice: its check and every stage's timing run the same call."""
        fn = self._fns.get(choice)
        if fn is None:
            fn = self._fns[choice] = self._call_of(choice)
        return fn

    def _call_of(self, choice: Choice) -> Callable[[], Any]:
        launch = self.launchers(choice)
        rt, tensors, out = choice.runtime_dict, self.tensors, self._output()
        if self.padded_rows and (rows := getattr(launch, "padded_rows", None)) is not None:
            return lambda: rows(tensors, **rt)
        binder = getattr(launch, "bound", None)
        bound = binder(tensors, **rt) if binder is not None and out.is_contiguous() else None
        if bound is not None:
            return lambda: bound(*tensors, out=out)
        return lambda: launch(tensors, out, **rt)

    def _output(self) -> torch.Tensor:
        if self._out is None:
            self._out = self.out_factory()
        return self._out

    def _check(self, fn: Callable[[], Any]) -> str | None:
        if self._ref is None:
            self._ref = Reference.of(self.ki, self.tensors)
        out = self._output()
        out.fill_(float("nan"))
        got = fn()  # the output written: `out`, or a padded twin's own rows
        got = got if isinstance(got, torch.Tensor) else out
        if got.is_cuda:
            torch.cuda.synchronize(got.device)
        return verdict(self.ki, got, self._ref)


def local_runner(ki: KernelInputs, tensors: Sequence[torch.Tensor], launchers: Callable[[Choice], Launcher],
                 settings: Any, out_layout: str | None) -> LocalRunner:
    """A LocalRunner with the timer `settings` asks for and outputs in `out_layout`.

    Example:
        >>> import torch, gemmtune
        >>> a, b = torch.randn(8, 4), torch.randn(4, 6)
        >>> ki = KernelInputs.from_tensors("mm", a, b)
        >>> local_runner(ki, (a, b), None, gemmtune.Settings(), "col")._output().stride()
        (1, 8)
    """
    return LocalRunner(ki, tensors, launchers, timer_for(ki.device, settings),
                       lambda: empty_output(ki.out_size, ki.result_dtype, ki.device, out_layout),
                       padded_rows=out_layout == "padded")
