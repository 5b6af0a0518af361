"""CudaTimer's round logic on a CPU: torch.cuda's events, synchronisation and device context are
replaced by fakes on a fake clock that only the timed functions advance, so interleaving, rotation and
the extra rounds run for real and read the same on a loaded machine."""

import contextlib
import types

import pytest
import torch

from gemmtune.measure import timers as measure


class Clock:
    """Seconds that pass only when a timed function says so."""

    now = 0.0

    @classmethod
    def read(cls):
        return cls.now


class FakeEvent:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = Clock.now

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


@pytest.fixture
def timer(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=Clock.read))
    t = measure.CudaTimer.__new__(measure.CudaTimer)
    t.device, t.rep_ms, t.min_reps, t.max_reps, t.count_host = torch.device("cpu"), 5.0, 5, 100, False
    t.flush, t._flush, t._sink, t._sleep = "read", torch.zeros(4096), torch.zeros(()), None
    t._events, t._flush_ms = [], None
    return t


def counted(run_s):
    """A function that takes `run_s` seconds of the fake clock (1 us at least), and its calls."""
    calls = []

    def fn():
        calls.append(1)
        Clock.now += max(run_s, 1e-6)
    return fn, calls


def test_short_functions_get_extra_rounds_up_to_the_cap(timer):
    (fast, n_fast), (slow, n_slow) = counted(0.0), counted(2e-4)
    costs = timer.time_interleaved([fast, slow], rounds=3)
    timed = len(n_fast) - 2  # minus the warm-up and the host-time probe
    assert len(n_fast) == len(n_slow)  # every round runs every function once
    assert 3 < timed <= 3 * measure.MAX_ROUNDS_FACTOR
    assert len(costs) == 2 and costs[1].cost_ms > costs[0].cost_ms
    # count_host=False: the cost is the GPU (event) time; the host time is reported beside it.
    assert all(m.cost_ms == m.gpu_ms and m.host_ms is not None and m.host_ms > 0 for m in costs)


def test_long_functions_keep_the_rounds_asked_for(timer):
    (a, n_a), (b, n_b) = counted(4e-3), counted(4e-3)
    timer.time_interleaved([a, b], rounds=3)  # 3 rounds already exceed 5 ms per function
    assert len(n_a) - 2 == 3 and len(n_b) - 2 == 3


def test_extra_rounds_arithmetic(timer):
    timer.rep_ms = 10.0
    assert timer.extra_rounds(15, 0.003, 4) == 135  # capped at 10x the rounds asked for
    assert timer.extra_rounds(15, 0.030, 4) == 5  # fills the remaining 10 ms at 2 ms per round
    assert timer.extra_rounds(15, 0.050, 4) == 0 and timer.extra_rounds(0, 0.0, 4) == 0


def test_time_counts_its_sizing_runs_and_fills_the_budget(timer):
    timer.rep_ms, timer.min_reps, timer.max_reps = 5.0, 5, 40
    fn, calls = counted(0.0)
    measured = timer.time(fn)
    timed = len(calls) - 2  # minus the warm-up and the host-time probe
    assert timed == timer.reps_for(measured.gpu_ms)  # the 3 sizing runs are samples, not thrown away
    assert 5 <= timed <= 40


def test_time_gives_long_kernels_min_reps_only(timer):
    timer.rep_ms, timer.min_reps, timer.max_reps = 5.0, 4, 40
    fn, calls = counted(3e-3)  # 3 ms per run: the 5 ms budget buys fewer than min_reps
    timer.time(fn)
    assert len(calls) - 2 == 4


def test_event_pairs_are_reused_across_calls(timer):
    fn, _ = counted(0.0)
    timer.time(fn)
    pool = len(timer._events)
    timer.time(fn)
    timer.time_interleaved([fn, fn], rounds=2)
    assert 0 < pool and len(timer._events) >= pool
    before = len(timer._events)
    timer.time(fn)
    assert len(timer._events) == before  # nothing new allocated for a call the pool already covers


def test_reps_budget_counts_the_flush(timer):
    timer.rep_ms, timer.min_reps, timer.max_reps, timer._flush_ms = 10.0, 5, 1000, 0.04
    assert timer.reps_for(0.01) == 200  # 10 ms / (0.01 + 0.04 ms)
    timer._flush_ms = 0.0
    assert timer.reps_for(0.01) == 1000  # capped


def test_measurement_cost_is_the_larger_of_gpu_and_host_time_when_host_counts(timer):
    from gemmtune.measure.timers import Measurement

    fn, _ = counted(0.0)
    timer.count_host = True
    m = timer.time(fn)
    assert isinstance(m, Measurement) and m.cost_ms == max(m.gpu_ms, m.host_ms)
    timer.count_host = False
    m = timer.time(fn)
    assert m.cost_ms == m.gpu_ms
    with pytest.raises(Exception):  # a value object: frozen
        m.cost_ms = 0.0


def test_a_reading_reports_the_spread_of_its_runs(timer):
    steady, _ = counted(1e-3)
    durations = iter([1e-3, 1e-3] + [1e-3, 2e-3] * 20)  # warm-up, host probe, then runs alternating 1 and 2 ms

    def jumpy():
        Clock.now += next(durations)

    a, b = timer.time_interleaved([steady, jumpy], rounds=4)
    assert a.spread == 0.0 and b.spread is not None and b.spread > 0.3  # IQR over median of its runs


def _syncs_counted(monkeypatch):
    """The timed runs enqueued between two synchronisations, as a list (the fake synchronize closes one)."""
    batches = [0]
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: batches.append(0))
    return batches


def test_time_never_queues_more_than_queue_runs_between_synchronisations(timer, monkeypatch):
    timer.rep_ms, timer.min_reps, timer.max_reps = 50.0, 5, 100
    batches = _syncs_counted(monkeypatch)
    calls = []

    def fn():
        calls.append(1)
        batches[-1] += 1
        Clock.now += 1e-6
    timer.time(fn)
    assert len(calls) - 2 == 100  # the budget asks for max_reps runs: several batches of them
    assert max(batches) <= measure.QUEUE_RUNS and sum(batches) == len(calls)


def test_interleaved_rounds_never_queue_more_than_queue_runs(timer, monkeypatch):
    batches = _syncs_counted(monkeypatch)
    fns = []
    for _ in range(5):
        def fn():
            batches[-1] += 1
            Clock.now += 1e-6
        fns.append(fn)
    timer.time_interleaved(fns, rounds=15)  # microsecond runs: extra rounds up to 150 in all
    timed = sum(batches) - 2 * len(fns)  # minus each one's warm-up and host-time probe
    assert timed > 15 * len(fns) and max(batches) <= measure.QUEUE_RUNS
    assert all(n % len(fns) == 0 for n in batches[2:-1])  # whole rounds between synchronisations


def test_each_function_keeps_its_own_readings_across_synchronisations(timer):
    (a, _), (b, _), (c, _) = counted(1e-5), counted(2e-5), counted(4e-5)
    readings = timer.time_interleaved([a, b, c], rounds=30)  # 30 rounds of 3: several synchronisations
    assert [round(m.gpu_ms, 6) for m in readings] == [0.01, 0.02, 0.04]  # no event pair read for another run
