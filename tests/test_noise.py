"""Timing noise: the CPU timer reports its spread, a tie within the noise goes to the library kernel,
and a pick decided under heavy noise is stored provisional and re-checked by the next tune."""

import sqlite3
import time

import pytest
import torch

import gemmtune
from gemmtune.measure.runners import LocalRunner
from gemmtune.measure.timers import CpuTimer, relative_spread
from gemmtune.core.choices import Choice, Timing
from gemmtune.search.final import FinalRule, final_decision
from gemmtune.store import memory
from gemmtune.store.sqlite import Row, Store
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate


# -- the CPU timer ---------------------------------------------------------------------------------

def test_cpu_timer_uses_blocked_autorange_with_the_rep_budget(monkeypatch):
    from torch.utils import benchmark

    asked = []
    real = benchmark.Timer.blocked_autorange

    def spy(self, callback=None, min_run_time=0.2):
        asked.append((min_run_time, self._task_spec.num_threads))
        return real(self, callback, min_run_time)

    monkeypatch.setattr(benchmark.Timer, "blocked_autorange", spy)
    # as if the first run took 0.2 ms (not a tiny kernel): the real sleep's first run, on a loaded machine,
    # could read a tenth of the budget or more, and such a kernel is timed singly, without blocked_autorange
    monkeypatch.setattr(CpuTimer, "_first_run", lambda self, fn, warm: 0.2)
    m = CpuTimer(rep_ms=20.0).time(lambda: time.sleep(0.0002))
    assert asked == [(0.02, torch.get_num_threads())]  # the budget, at torch's thread count
    assert m.cost_ms > 0 and m.gpu_ms is None and m.spread is not None and m.spread >= 0


def test_tiny_kernels_and_prescreening_get_less_of_the_budget(monkeypatch):
    from torch.utils import benchmark

    timer = CpuTimer(rep_ms=50.0)
    # 400 runs' worth for a tiny kernel, never under a fifth of rep_ms; prescreening 40% of it
    assert [timer.budget_ms(ms) for ms in (0.01, 0.05, 1.0)] == [10.0, 20.0, 50.0]
    assert timer.budget_ms(1.0, "prescreen") == 20.0 and timer.budget_ms(0.01, "prescreen") == 4.0
    asked = []
    real = benchmark.Timer.blocked_autorange
    monkeypatch.setattr(benchmark.Timer, "blocked_autorange",
                        lambda self, callback=None, min_run_time=0.2: asked.append(min_run_time) or real(self, callback, min_run_time))
    monkeypatch.setattr(CpuTimer, "_first_run", lambda self, fn, warm: 0.2)  # as if one run took 0.2 ms
    timer.time(lambda: None), timer.time(lambda: None, stage="prescreen")
    assert asked == [pytest.approx(0.05), pytest.approx(0.02)]


def test_a_checked_function_is_timed_without_another_warm_up():
    calls = []
    CpuTimer(rep_ms=5.0).time(lambda: (calls.append(1), time.sleep(0.01)), warm=True)
    assert len(calls) == 1  # one run already spends the budget, and the check's run was the warm-up
    calls.clear()
    CpuTimer(rep_ms=5.0).time(lambda: (calls.append(1), time.sleep(0.01)))
    assert len(calls) == 2


def test_the_interleaved_retime_of_slow_kernels_keeps_to_its_budget():
    calls = [[], []]
    fns = [lambda i=i: (calls[i].append(1), time.sleep(0.01)) for i in range(2)]
    ms = CpuTimer(rep_ms=20.0).time_interleaved(fns, rounds=15)
    # 15 rounds of a 10 ms run would be 150 ms per function against a 20 ms budget: 5 rounds (spread
    # still known), blocks of one run without a warm-up run each, the sizing run the first round's
    assert [len(c) for c in calls] == [5, 5] and all(m.spread is not None for m in ms)


def test_cpu_timer_keeps_its_budget_for_a_slow_function():
    calls = []
    CpuTimer(rep_ms=30.0).time(lambda: (calls.append(1), time.sleep(0.004)))
    # blocked_autorange's own sizing could run a block ten times the budget (about 75 runs); ours stays
    # near it. A run never takes less than its 4 ms sleep, so this bound holds however loaded the host is.
    assert len(calls) <= 12


def test_interleaved_timing_reports_spread_per_function():
    ms = CpuTimer(rep_ms=10.0).time_interleaved([lambda: sum(range(500)), lambda: sum(range(5000))], rounds=5)
    assert ms[0].cost_ms < ms[1].cost_ms and all(m.spread is not None for m in ms)


def test_relative_spread_is_iqr_over_median():
    assert relative_spread([8.0, 8.0, 12.0, 16.0, 20.0]) == pytest.approx(8.0 / 12.0)
    assert relative_spread([1.0, 1.0, 1.0]) == 0.0 and relative_spread([1.0]) is None


# -- the final decision ----------------------------------------------------------------------------

LIB, GEN = Choice("aten_mm", None), Choice("numba_mm", "h", family="numba")


def _decide(gen_ms, spread, limit=0.1):
    records = {LIB: Timing(LIB, 1.0, "final"), GEN: Timing(GEN, gen_ms, "final")}

    def retime(choices, rounds):
        for c in choices:
            records[c] = Timing(c, records[c].ms, "finalist", spread=spread)
        return [records[c].ms for c in choices]

    ranked = [Timing(GEN, gen_ms, "final"), Timing(LIB, 1.0, "final")]
    return final_decision(ranked, records, retime, FinalRule(3, 15, 0.01, noise_limit=limit))


def test_a_win_inside_the_noise_is_a_tie_the_library_keeps():
    d = _decide(0.9, spread=0.3)
    assert d.choice == LIB and d.noisy and d.provisional


def test_a_win_beyond_the_noise_stands_and_is_firm():
    d = _decide(0.9, spread=0.02)
    assert d.choice == GEN and not d.noisy and not d.provisional


def test_without_a_spread_the_old_rule_holds():
    assert _decide(0.995, spread=None).choice == LIB and _decide(0.9, spread=None).choice == GEN


# -- the store's provisional mark ------------------------------------------------------------------

def test_store_marks_and_unmarks_provisional_picks(tmp_path):
    s = Store(tmp_path / "s.sqlite")
    pick = Row("aten_mm", None, "{}", "{}", 1.0, "ok")
    s.save("e", {}, "p", "p", [pick], pick, replace_pick=False, provisional="run-1")
    assert s.load("e", "p").provisional == "run-1"
    s.save("e", {}, "p", "p", [pick], pick, replace_pick=False)  # ignored: the pick stands
    assert s.load("e", "p").provisional == "run-1"
    s.save("e", {}, "p", "p", [pick], pick, replace_pick=True, provisional="run-2")
    assert s.load("e", "p").provisional == "run-2"
    s.save("e", {}, "p", "p", [pick], pick, replace_pick=True)
    assert s.load("e", "p").provisional is None and s.load("e", "other").provisional is None


def test_an_old_store_without_the_table_gains_it(tmp_path):
    # a store of ours written before provisional picks existed: marked, without the table
    path = tmp_path / "old.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE provisional_picks")
    db.execute("INSERT INTO picks(env, problem, describe, template, src_hash, config, runtime, ms, strategy, recorded) "
               "VALUES ('e','p','p','aten_mm',NULL,'{}','{}',1.0,'x',0)")
    db.commit()
    db.close()
    stored = Store(path).load("e", "p")
    assert stored.pick is not None and stored.provisional is None


# -- end to end: a noisy tune stores a provisional pick, a quiet one firms it ------------------------

class FakeTimes:
    """LocalRunner's timing replaced: the scripted kernel is 10% faster, with the given spread."""

    MS = {"aten_mm": 1.0, "scripted": 0.9}

    def __init__(self, monkeypatch, spread):
        self.spread, self.retimed = spread, 0
        monkeypatch.setattr(LocalRunner, "time", self.time)
        monkeypatch.setattr(LocalRunner, "time_interleaved", self.time_interleaved)

    def time(self, choice, stage, *, check):
        return Timing(choice, self.MS[choice.template_uid], stage, spread=self.spread)

    def time_interleaved(self, choices, rounds):
        self.retimed += 1
        return [Timing(c, self.MS[c.template_uid], "finalist", spread=self.spread) for c in choices]


def _tune(store):
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    settings = gemmtune.Settings(isolation="off", strategy="exhaustive")
    return gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate(n_configs=1, runtime=(1,))],
                         settings=settings, store=store)


def test_noisy_pick_is_provisional_then_firmed_by_a_quiet_run(monkeypatch, tmp_path):
    from gemmtune import engine

    store = Store(tmp_path / "s.sqlite")
    noisy = FakeTimes(monkeypatch, spread=0.4)
    first = _tune(store)
    assert first.winner.template_uid == "aten_mm" and first.noisy and first.provisional
    assert noisy.retimed == 1
    assert _tune(store).cache_hit and noisy.retimed == 1  # the same run does not re-check its own pick
    monkeypatch.setattr(memory, "RUN_ID", "a-later-run")
    monkeypatch.setattr(memory, "RUN_STARTED", time.time() + 1.0)
    quiet = FakeTimes(monkeypatch, spread=0.01)
    second = _tune(store)  # a partial hit: the finalists are re-timed, not taken from the store
    assert quiet.retimed == 1 and not second.cache_hit
    assert second.winner.template_uid == "scripted" and not second.noisy and not second.provisional
    third = _tune(store)  # firm now: a plain cache hit
    assert third.cache_hit and third.winner.template_uid == "scripted" and quiet.retimed == 1


def test_a_firm_pick_is_not_rechecked(monkeypatch, tmp_path):
    from gemmtune import engine

    store = Store(tmp_path / "s.sqlite")
    FakeTimes(monkeypatch, spread=0.01)
    assert not _tune(store).provisional
    monkeypatch.setattr(memory, "RUN_ID", "a-later-run")
    monkeypatch.setattr(memory, "RUN_STARTED", time.time() + 1.0)
    again = FakeTimes(monkeypatch, spread=0.4)
    assert _tune(store).cache_hit and again.retimed == 0


def test_a_clearly_slower_function_is_cut_short():
    timer = CpuTimer(rep_ms=40.0)
    fast = timer.time(lambda: None)  # a median of microseconds: under any load far below a third of 10 ms
    calls = []
    slow = timer.time(lambda: (calls.append(1), time.sleep(0.01)))
    assert slow.cost_ms > 3 * fast.cost_ms and len(calls) == 3 and slow.spread is None  # warm-up and two runs
    again = CpuTimer(rep_ms=40.0)
    calls.clear()
    again.time(lambda: (calls.append(1), time.sleep(0.01)))  # nothing faster seen: the full budget
    assert len(calls) > 3


def test_a_finalist_left_out_of_the_retime_does_not_make_the_pick_provisional():
    far = Choice("numba_mm", "h2", family="numba")
    records = {LIB: Timing(LIB, 1.0, "final", spread=0.05), GEN: Timing(GEN, 1.1, "final", spread=0.05),
               far: Timing(far, 3.0, "prescreen", spread=0.9)}  # 3x slower, a cheap and noisy stage-1 timing

    def retime(cs, rounds):  # as Bench.retime on CPU: the one that cannot win keeps its earlier timing
        for c in cs:
            if c != far:
                records[c] = Timing(c, records[c].ms, "finalist", spread=0.05)
        return [records[c].ms for c in cs]

    ranked = [Timing(LIB, 1.0, "final"), Timing(GEN, 1.1, "final"), Timing(far, 3.0, "prescreen")]
    d = final_decision(ranked, records, retime, FinalRule(3, 15, 0.01))
    assert d.choice == LIB and not d.provisional and not d.noisy
    records[GEN] = Timing(GEN, 1.1, "final", spread=0.05)
    loud = lambda cs, rounds: [records.update({c: Timing(c, records[c].ms, "finalist", spread=0.5)}) or records[c].ms
                               for c in cs if c != far] + [3.0]
    assert final_decision(ranked, records, loud, FinalRule(3, 15, 0.01)).provisional  # the re-timed ones' noise counts
