"""Jobs for the worker process: picklable objects whose `run(state)` does the work there.

The caller sends a job over the worker's connection; the worker runs it against
its `WorkerState` and sends back the value (gemmtune.measure.worker).  The work
itself is a `LocalRunner`'s, built by `Setup` inside the worker, so a check or
a timing runs the same code isolated or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core.choices import Choice, Timing
from ..core.inputs import KernelInputs
from .compile import Launchers
from .runners import LocalRunner, local_runner


class WorkerState:
    """What a worker keeps between jobs: the runner of the problem it was last set up for."""

    def __init__(self) -> None:
        self.runner: LocalRunner | None = None

    def require(self) -> LocalRunner:
        if self.runner is None:
            raise RuntimeError("the worker was not set up for a problem")
        return self.runner


class WorkerJob:
    """A unit of work for the worker.

    Example:
        >>> Reset().run(WorkerState()) is None
        True
    """

    def run(self, state: WorkerState) -> Any:
        raise NotImplementedError

    def failure(self, value: Any) -> str | None:
        """Why `value` (this job's answer) is a failure, or None.  After a failure the worker
        checks its CUDA context: a poisoned one makes it exit, and the caller restarts it."""
        return None


@dataclass(frozen=True)
class Setup(WorkerJob):
    """Copy the inputs into the worker and build the runner every later job uses."""

    op: str
    tensors: tuple
    alpha: float
    beta: float
    templates: tuple  # Template objects, pickled by reference to their classes
    settings: Any
    out_layout: str | None
    device_type: str
    options: tuple = ()  # scaled_mm's (name, value) pairs: out_dtype, fast_accum (KernelInputs.options)

    def run(self, state: WorkerState) -> None:
        local = "cuda:0" if self.device_type == "cuda" else "cpu"  # the one device this worker sees
        # Our own copies: a kernel that writes out of bounds here writes into the worker's memory.
        tensors = tuple(t.to(local).clone() for t in self.tensors)
        ki = KernelInputs.from_tensors(self.op, *tensors, alpha=self.alpha, beta=self.beta, **dict(self.options))
        launchers = Launchers({t.uid: t for t in self.templates}, ki, tensors,
                              timeout_s=self.settings.compile_timeout_s)
        state.runner = local_runner(ki, tensors, launchers, self.settings, self.out_layout)


@dataclass(frozen=True)
class Check(WorkerJob):
    choice: Choice

    def run(self, state: WorkerState) -> str | None:
        return state.require().check(self.choice)

    def failure(self, value: str | None) -> str | None:
        return value


@dataclass(frozen=True)
class Time(WorkerJob):
    choice: Choice
    stage: str
    check: bool

    def run(self, state: WorkerState) -> Timing:
        return state.require().time(self.choice, self.stage, check=self.check)

    def failure(self, value: Timing) -> str | None:
        return None if value.status == "ok" else value.detail


@dataclass(frozen=True)
class TimeInterleaved(WorkerJob):
    choices: tuple
    rounds: int

    def run(self, state: WorkerState) -> list[Timing]:
        return state.require().time_interleaved(self.choices, self.rounds)


@dataclass(frozen=True)
class SecondOpinion(WorkerJob):
    choices: tuple

    def run(self, state: WorkerState) -> tuple[str, list[float]] | None:
        return state.require().second_opinion(self.choices)


@dataclass(frozen=True)
class Reset(WorkerJob):
    """Drop the inputs and launchers, so an idle worker holds no device memory beyond its context."""

    def run(self, state: WorkerState) -> None:
        state.runner = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
