"""Bench and runners: one Bench per tune, built with its runner and deadline; the replay runner."""

import time

import pytest
import torch

import gemmtune
from gemmtune import engine
from gemmtune.measure.bench import Bench
from gemmtune.measure.budget import Budget
from gemmtune.pipeline import steps
from gemmtune.measure.compile import CompileResult
from gemmtune.measure.replay import ReplayRunner
from gemmtune.measure.runners import RunFailed
from gemmtune.measure.timers import CpuTimer, Measurement
from gemmtune.core.choices import Choice, Timing
from gemmtune.core.inputs import KernelInputs
from gemmtune.store.sqlite import Store
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate

from helpers import ScriptedTemplate

LIB, GEN, SLOW = Choice("aten_mm", None), Choice("gen", "h1"), Choice("gen", "h2", (("TILE", 16),))


def ki():
    return KernelInputs.from_tensors("mm", torch.randn(8, 4), torch.randn(4, 6))


def test_cpu_timer_gives_wall_time_measurements_without_gpu_fields():
    timer = CpuTimer(rep_ms=1.0)
    m = timer.time(lambda: sum(range(100)))
    assert isinstance(m, Measurement) and m.cost_ms > 0 and m.gpu_ms is None and m.host_ms is None
    both = timer.time_interleaved([lambda: None, lambda: sum(range(1000))], rounds=2)
    assert [type(x) for x in both] == [Measurement, Measurement] and all(x.gpu_ms is None for x in both)


def test_past_the_deadline_only_library_kernels_are_timed():
    runner = ReplayRunner({LIB.key: 2.0, GEN.key: 1.0})
    bench = Bench(ki(), runner, CompileResult(), runnable=2, budget=Budget(seconds=1.0, started=time.perf_counter() - 2.0))
    assert bench.measure([GEN, LIB], "final") == [None, 2.0]
    assert bench.budget_exhausted and bench.runs == 1 and runner.asked == [LIB]
    assert GEN not in bench.records  # not decided about: a later tune times it


def test_bench_records_replayed_failures_and_answers_each_choice_once():
    runner = ReplayRunner([Timing(LIB, 2.0, "final", gpu_ms=1.5, host_ms=2.0),
                           Timing(GEN, None, "final", "wrong_result", "relative error 1e0 > 1e-4")])
    with Bench(ki(), runner, CompileResult(), runnable=3) as bench:
        assert bench.measure([LIB, GEN, SLOW], "prescreen") == [2.0, None, None]
        assert bench.measure([LIB, GEN], "final") == [2.0, None]  # recorded: never run twice
    assert [c.key for c in runner.asked] == [LIB.key, GEN.key, SLOW.key]
    assert bench.records[LIB] == Timing(LIB, 2.0, "prescreen", gpu_ms=1.5, host_ms=2.0)
    assert bench.records[GEN].status == "wrong_result" and bench.records[SLOW].status == "run_failed"
    assert bench.runs == 1 and bench.isolation == "replay"


def test_retime_keeps_earlier_timings_when_the_runner_cannot_answer():
    class Lost(ReplayRunner):
        def time_interleaved(self, choices, rounds):
            raise RunFailed("worker died")

    bench = Bench(ki(), Lost({LIB.key: Measurement(2.0, 1.0, 2.0), GEN.key: 1.0}), CompileResult(), runnable=2)
    bench.measure([LIB, GEN], "final")
    assert bench.retime([GEN, LIB, SLOW], rounds=3) == [1.0, 2.0, float("inf")]
    assert bench.records[LIB] == Timing(LIB, 2.0, "finalist", gpu_ms=1.0, host_ms=2.0) and bench.runs == 5


def test_cpu_retime_skips_finalists_that_cannot_win():
    # GEN 1.0 ms, LIB 1.8 ms, SLOW 2.5 ms separately: SLOW (more than twice GEN's time) keeps its timing
    runner = ReplayRunner({LIB.key: 1.8, GEN.key: 1.0, SLOW.key: 2.5})
    bench = Bench(ki(), runner, CompileResult(), runnable=3)
    bench.measure([LIB, GEN, SLOW], "final")
    runner.asked.clear()
    assert bench.retime([GEN, LIB, SLOW], rounds=3) == [1.0, 1.8, 2.5]
    assert runner.asked == [GEN, LIB] and bench.runs == 3 + 2
    assert bench.records[SLOW].stage == "final" and bench.records[LIB].stage == "finalist"


def test_cpu_retime_of_a_lone_library_contender_runs_nothing():
    runner = ReplayRunner({LIB.key: 1.0, GEN.key: 3.0})  # the generated kernel cannot win
    bench = Bench(ki(), runner, CompileResult(), runnable=2)
    bench.measure([LIB, GEN], "final")
    runner.asked.clear()
    assert bench.retime([LIB, GEN], rounds=3) == [1.0, 3.0] and runner.asked == [] and bench.runs == 2


def _templates():
    return [AtenTemplate("mm"), NumpyTemplate(), ScriptedTemplate(n_configs=3, runtime=(1, 2))]


def _designed(choice):
    """Library kernels 1 ms; generated ones from 0.4 ms (TILE=8, group=1) upwards."""
    if choice.is_extern:
        return Measurement(1.0 if choice.template_uid == "aten_mm" else 1.2)
    return Measurement(0.4 + 0.1 * choice.config_dict["TILE"] / 8 + 0.05 * choice.runtime_dict["group"])


def test_a_tune_replays_recorded_timings_to_the_same_pick(monkeypatch):
    a, b = torch.randn(24, 16), torch.randn(16, 20)
    settings = gemmtune.Settings(isolation="off", store="off", strategy="exhaustive", cpu_rep_ms=1.0)
    real = gemmtune.tune("mm", a, b, templates=_templates(), settings=settings, store=Store(":memory:"))
    recorded = {t.choice.key: _designed(t.choice) for t in real.timings}
    runners = []

    def replay(*args, **kw):
        runners.append(ReplayRunner(recorded if len(runners) == 0 else first.timings))
        return runners[-1]

    monkeypatch.setattr(engine, "runner_for", replay)
    first = gemmtune.tune("mm", a, b, templates=_templates(), settings=settings, store=Store(":memory:"))
    assert first.isolation == "replay"
    assert first.winner.config_dict == {"TILE": 8} and first.winner.runtime_dict == {"group": 1}
    assert all(t.ms == recorded[t.choice.key].cost_ms for t in first.timings)
    assert any(t.stage == "finalist" for t in first.timings)
    torch.testing.assert_close(first(a, b), a @ b)  # the replayed winner is a real, compiled kernel
    again = gemmtune.tune("mm", a, b, templates=_templates(), settings=settings, store=Store(":memory:"))
    assert again.winner == first.winner and again.benchmark_runs == first.benchmark_runs
    assert {t.choice: t.ms for t in again.timings} == {t.choice: t.ms for t in first.timings}


class _Sealed(Bench):
    """A Bench that fails on any attribute set from outside once it is built."""

    made = []

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._sealed = True
        _Sealed.made.append(kw)

    def __setattr__(self, name, value):
        if getattr(self, "_sealed", False) and name in ("budget", "runnable", "runner", "known"):
            raise AssertionError(f"Bench.{name} set after construction")
        super().__setattr__(name, value)


@pytest.mark.parametrize("budget_s", [None, 30.0])
def test_the_engine_builds_one_bench_with_its_budget(monkeypatch, budget_s):
    _Sealed.made = []
    monkeypatch.setattr(steps, "Bench", _Sealed)
    settings = gemmtune.Settings(isolation="off", store="off", cpu_rep_ms=1.0, budget_s=budget_s)
    sel = gemmtune.tune("mm", torch.randn(16, 8), torch.randn(8, 12), templates=_templates(), settings=settings)
    (kw,) = _Sealed.made
    assert (kw["budget"].deadline is None) == (budget_s is None) and kw["runnable"] == len(sel.timings)
    assert sel.benchmark_runs > 0 and not sel.budget_exhausted
