"""CudaTimer's round logic on a CPU: torch.cuda's events, synchronisation and device context are
replaced by host-clock fakes, so interleaving, rotation and the extra rounds run for real."""

import contextlib
import time

import pytest
import torch

from gemmtune import measure


class FakeEvent:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


@pytest.fixture
def timer(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    t = measure.CudaTimer.__new__(measure.CudaTimer)
    t.device, t.rep_ms, t.min_reps, t.max_reps, t.count_host = torch.device("cpu"), 5.0, 5, 100, False
    t.flush, t._flush, t._sink, t._sleep = "read", torch.zeros(4096, dtype=torch.int32), torch.zeros((), dtype=torch.int64), None
    t.last, t.last_all = (0.0, 0.0), []
    return t


def counted(sleep_s):
    calls = []

    def fn():
        calls.append(1)
        if sleep_s:
            time.sleep(sleep_s)
    return fn, calls


def test_short_functions_get_extra_rounds_up_to_the_cap(timer):
    (fast, n_fast), (slow, n_slow) = counted(0.0), counted(2e-4)
    costs = timer.time_interleaved([fast, slow], rounds=3)
    timed = len(n_fast) - 2  # minus the warm-up and the host-time probe
    assert len(n_fast) == len(n_slow)  # every round runs every function once
    assert 3 < timed <= 3 * measure.MAX_ROUNDS_FACTOR
    assert costs[1] > costs[0] and len(timer.last_all) == 2


def test_long_functions_keep_the_rounds_asked_for(timer):
    (a, n_a), (b, n_b) = counted(4e-3), counted(4e-3)
    timer.time_interleaved([a, b], rounds=3)  # 3 rounds already exceed 5 ms per function
    assert len(n_a) - 2 == 3 and len(n_b) - 2 == 3


def test_extra_rounds_arithmetic(timer):
    timer.rep_ms = 10.0
    assert timer.extra_rounds(15, 0.003, 4) == 135  # capped at 10x the rounds asked for
    assert timer.extra_rounds(15, 0.030, 4) == 5  # fills the remaining 10 ms at 2 ms per round
    assert timer.extra_rounds(15, 0.050, 4) == 0 and timer.extra_rounds(0, 0.0, 4) == 0
