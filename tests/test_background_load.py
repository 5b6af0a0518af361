"""CPU timings taken while other processes held the cores: counted from /proc, and such a pick is provisional."""

from __future__ import annotations

import os
import time

import pytest
import torch

import gemmtune
from gemmtune import engine
from gemmtune.measure import floor, load
from gemmtune.measure.cpu_timer import CpuTimer
from gemmtune.measure.replay import ReplayRunner
from gemmtune.report import autotune_table, selection_dict
from gemmtune.store import memory
from gemmtune.store.sqlite import Store
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate


def test_other_cores_and_the_verdict_from_given_ticks():
    # 2 s of timing at 100 ticks/s: the cores were busy for 760 ticks, 400 of them this process's
    assert load.other_cores(760, 400, 2.0, 100) == pytest.approx(1.8)
    assert load.other_cores(100, 150, 1.0, 100) == 0.0  # our ticks can run ahead of the machine's: no load
    assert load.loaded(1.8, cpus=2, threads=2) and load.loaded(0.6, cpus=2, threads=2)
    assert not load.loaded(0.4, cpus=2, threads=2)  # a quiet machine: a daemon's wake-ups
    assert not load.loaded(1.8, cpus=4, threads=2) and load.loaded(2.6, cpus=4, threads=2)  # idle cores absorb it
    assert not load.loaded(None, cpus=2, threads=2)  # unknown: no verdict


def test_the_cpu_timer_counts_only_while_it_times(monkeypatch):
    snaps = iter([load.Snapshot(0, 0, 0.0), load.Snapshot(360, 200, 1.0),   # a timing: 1.6 cores elsewhere
                  load.Snapshot(900, 200, 5.0), load.Snapshot(900, 200, 5.0)])  # a zero-length one
    monkeypatch.setattr(load.Snapshot, "take", classmethod(lambda cls: next(snaps)))
    timer = CpuTimer(rep_ms=1.0)
    assert timer.background_cores() is None
    monkeypatch.setattr(timer, "_time", lambda fn, warm, stage: None)
    timer.time(lambda: None)
    timer.time(lambda: None)  # the 4 s between the two timings are not counted
    timer.load.hz = 100.0
    assert timer.background_cores() == pytest.approx(1.6)


MEASURED_PEAK = floor.machine_peak


@pytest.fixture(autouse=True)
def _a_slow_machine(monkeypatch):
    """The stand-in readings (1 ms for a 16x8x12 mm) are within reach of this machine's floor."""
    monkeypatch.setattr(floor, "machine_peak", lambda: floor.Peak(flops_per_s=1e6, bytes_per_s=1e6, call_s=1e-4))


class _Timer:
    def __init__(self, cores):
        self.cores = cores

    def background_cores(self):
        return self.cores


class _LoadedReplay(ReplayRunner):
    """Clear, quiet-looking timings (the generated kernel 2x slower), from a timer that saw `cores` busy elsewhere."""

    def __init__(self, cores):
        super().__init__({})
        self.timer = _Timer(cores)

    def time(self, choice, stage, *, check):
        from gemmtune.core.choices import Timing

        return Timing(choice, 1.0 if choice.is_extern else 2.0, stage, spread=0.01)


@pytest.mark.parametrize("cores", [1.8, 0.1, None])
def test_a_tune_timed_under_load_is_provisional_and_says_why(monkeypatch, cores):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(load.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(engine, "runner_for", lambda *a, **kw: _LoadedReplay(cores))
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate(n_configs=1, runtime=(1,))],
                        settings=gemmtune.Settings(isolation="off", strategy="exhaustive"), store=Store(":memory:"))
    assert sel.winner.template_uid == "aten_mm" and sel.background_load == cores
    assert sel.provisional == (cores == 1.8) and selection_dict(sel)["background_load"] == cores
    assert ("other processes kept 1.8 cores busy" in autotune_table(sel)) == (cores == 1.8)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc: no verdict (Linux only)")
def test_a_real_timing_reads_the_machine():
    snap = load.Snapshot.take()
    assert snap is not None and snap.busy > 0 and snap.own > 0  # /proc/stat and /proc/self/stat parsed
    timer = CpuTimer(rep_ms=60.0)
    timer.time(lambda: time.sleep(0.002))
    assert timer.load.wall >= 0.05 and timer.background_cores() is not None


class _FastUnderLoad(_LoadedReplay):
    """Timings in which the generated kernel reads 2x faster than the library kernel, clearly (spread 1 %),
    from a timer that saw `cores` busy elsewhere."""

    def time(self, choice, stage, *, check):
        from gemmtune.core.choices import Timing

        return Timing(choice, 1.0 if choice.is_extern else 0.5, stage, spread=0.01)

    def time_interleaved(self, choices, rounds):
        return [self.time(c, "finalist", check=False) for c in choices]

    def check(self, choice):
        return None  # every kernel is correct


def _tune(monkeypatch, cores, store):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(load.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(engine, "runner_for", lambda *a, **kw: _FastUnderLoad(cores))
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    return gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate(n_configs=1, runtime=(1,))],
                         settings=gemmtune.Settings(isolation="off", strategy="exhaustive"), store=store)


@pytest.mark.parametrize("cores, winner", [(1.8, "aten_mm"), (0.1, "scripted")])
def test_a_busy_machine_never_decides_for_a_generated_kernel(monkeypatch, cores, winner):
    """Under load the readings do not show that a generated kernel beat the library kernel, however clear
    they look: the library kernel is kept, provisional; on a quiet machine the faster kernel wins, firm."""
    sel = _tune(monkeypatch, cores, Store(":memory:"))
    assert sel.winner.template_uid.startswith(winner) and sel.provisional == (cores == 1.8)
    if cores == 1.8:
        assert "the library kernel is kept" in " ".join(autotune_table(sel, width=1000).split())


def test_a_quiet_tune_then_decides_and_a_busy_one_keeps_a_firm_stored_pick(monkeypatch, tmp_path):
    store = Store(str(tmp_path / "store.sqlite"))
    assert _tune(monkeypatch, 1.8, store).winner.template_uid == "aten_mm"  # provisional, stored
    monkeypatch.setattr(memory, "RUN_ID", "a-later-run")  # a later process re-checks it, on a quiet machine
    monkeypatch.setattr(memory, "RUN_STARTED", time.time() + 1.0)
    quiet = _tune(monkeypatch, 0.1, store)
    assert quiet.winner.template_uid.startswith("scripted") and not quiet.provisional
    busy = _tune(monkeypatch, 1.8, store)  # a firm pick from a quiet tune stands under load
    assert busy.winner.template_uid.startswith("scripted") and busy.cache_hit


def test_a_library_reading_far_above_its_floor_decides_as_a_busy_machine(monkeypatch):
    """No other process in /proc, but the library kernel read 1 ms for a 16x8x12 mm, about 500x the floor
    of a machine doing 1e11 FLOP/s: a throttled or shared core. The library kernel is kept, provisional."""
    monkeypatch.setattr(floor, "machine_peak", lambda: floor.Peak(flops_per_s=1e11, bytes_per_s=1e10, call_s=1e-6))
    sel = _tune(monkeypatch, 0.1, Store(":memory:"))
    assert sel.winner.template_uid == "aten_mm" and sel.provisional


def test_the_floor_is_the_problems_work_at_the_measured_peak_plus_a_call():
    work = floor.Work(flops=2e9, bytes=4e6)
    peak = floor.Peak(flops_per_s=1e11, bytes_per_s=1e10, call_s=2e-6)
    assert floor.floor_ms(work, peak) == pytest.approx(20.002)  # compute-bound: 2e9 / 1e11 s, plus the call
    assert floor.floor_ms(floor.Work(2e6, 4e8), peak) == pytest.approx(40.002)  # bytes-bound
    assert not floor.far_above(300.0, work, peak) and floor.far_above(500.0, work, peak)
    assert not floor.far_above(None, work, peak)
    measured = MEASURED_PEAK.__wrapped__()  # this machine, measured: positive and finite
    assert 0 < measured.call_s < 1 and measured.flops_per_s > 1e6 and measured.bytes_per_s > 1e6
