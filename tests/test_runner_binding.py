"""LocalRunner checks and times a candidate as a warm eager call runs it: through its launcher's binding to
the problem (`launch.bound`) where there is one and the output is row-major, else through its launcher.
Real kernels: torch.mm on CPU."""

from __future__ import annotations

import torch

from gemmtune.core.choices import Choice
from gemmtune.core.inputs import KernelInputs
from gemmtune.measure.runners import LocalRunner
from gemmtune.measure.timers import CpuTimer

CHOICE = Choice("aten_mm", None)


def _launcher(calls, bound_result=None):
    def launch(tensors, out=None):
        calls.append("launcher")
        return torch.mm(*tensors, out=out)

    def bound(*tensors, out=None):
        calls.append("bound")
        return torch.mm(*tensors, out=out) if bound_result is None else out.copy_(bound_result)

    launch.bound = lambda tensors: calls.append("bind") or bound
    return launch


def _runner(launch, out):
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    return LocalRunner(KernelInputs.from_tensors("mm", a, b), (a, b), lambda c: launch, CpuTimer(rep_ms=1), out)


def test_a_candidate_is_checked_and_timed_through_its_binding_to_the_problem():
    calls = []
    runner = _runner(_launcher(calls), lambda: torch.empty(8, 6))
    assert runner.check(CHOICE) is None
    assert runner.time(CHOICE, "final", check=True).status == "ok"
    assert runner.time_interleaved([CHOICE], 3)[0].ms is not None
    assert "launcher" not in calls and calls.count("bind") == 1 and "bound" in calls  # bound once, for all


def test_the_check_reads_the_bound_path():
    calls = []
    runner = _runner(_launcher(calls, bound_result=torch.zeros(8, 6)), lambda: torch.empty(8, 6))
    assert runner.check(CHOICE) is not None  # the launcher is right, its binding is not: the check says so
    assert runner.time(CHOICE, "final", check=True).status == "wrong_result"


def test_a_binding_that_declines_or_a_column_major_output_runs_the_launcher():
    calls = []
    launch = _launcher(calls)
    launch.bound = lambda tensors: calls.append("bind") and None
    assert _runner(launch, lambda: torch.empty(8, 6)).check(CHOICE) is None
    assert calls == ["bind", "launcher"]
    calls.clear()
    col = _runner(_launcher(calls), lambda: torch.empty(6, 8).t())  # a column-major output: never bound
    assert col.check(CHOICE) is None and calls == ["launcher"]
