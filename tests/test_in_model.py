"""The in-model check: a generated pick stays only where the model's forward runs faster with it."""

from __future__ import annotations

import pytest
import torch

import gemmtune
from gemmtune import engine
from gemmtune.dispatch import eager, in_model, patching
from gemmtune.dispatch.table import TABLE
from helpers import TwoGemmNet as Net

pytestmark = pytest.mark.usefixtures("memory_store")


def _numba_winners(monkeypatch) -> None:
    """Tune every problem among numba kernels only, whatever backends the call allows."""
    real = engine.tune
    monkeypatch.setattr(engine, "tune", lambda op, *t, backends=None, **kw: real(op, *t, backends=("numba",), **kw))


def _reference(net: Net, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.relu(x @ net.lin.weight.t()) @ net.w2


def test_warmup_sends_picks_that_slow_the_forward_to_torch(monkeypatch):
    _numba_winners(monkeypatch)
    net, x = Net(), torch.randn(6, 24)
    report = gemmtune.warmup(net, x, progress=False, in_model=True, release=False)  # the patched layer's path
    assert [r.winner.startswith("numba") for r in report.rows] == [True, True]
    # numba's call costs tens of microseconds where torch.mm on these sizes costs a few
    assert all(r.in_model is not None and not r.in_model.kept for r in report.rows), report.table()
    assert all(r.runs == "torch (in-model check)" for r in report.rows)
    assert "in model" in report.table() and report.check_s > 0
    with torch.no_grad():
        net(x)  # the layer's first call after the check finds F.linear by its signature, then by its shape
    linear_calls = []
    monkeypatch.setattr(patching, "_linear", lambda *a: linear_calls.append(1) or torch.nn.functional.linear(*a))
    mm_calls = []
    TABLE.replace_runner("mm", torch.mm, lambda a, b: mm_calls.append(1) or torch.mm(a, b))
    with torch.no_grad():
        out = net(x)
    torch.testing.assert_close(out, _reference(net, x))
    assert linear_calls == [1] and mm_calls == [1]  # the layer and the direct call both run torch's op


def test_cpu_checks_by_default_but_not_when_off_nor_without_the_library_backend(monkeypatch):
    """On CPU a numba pick runs on numba's thread pool, not torch's: checked in the model by default."""
    _numba_winners(monkeypatch)
    net, x = Net(), torch.randn(5, 24)
    report = gemmtune.warmup(net, x, progress=False)
    assert all(r.winner.startswith("numba") and r.in_model is not None for r in report.rows), report.table()
    gemmtune.clear_dispatch_cache()
    report = gemmtune.warmup(net, x, progress=False, in_model=False)
    assert all(r.in_model is None for r in report.rows)
    assert "lower quartile" not in report.table()  # no legend for a column nothing filled
    gemmtune.clear_dispatch_cache()
    report = gemmtune.warmup(net, x, progress=False, backends=("numba",), in_model=True)
    assert [r.in_model for r in report.rows if r.problem.startswith("mm(5x24")] == [None]


def _switches(net: Net, x: torch.Tensor) -> list[in_model.Switch]:
    with eager.recording() as seen, torch.no_grad():
        net(x)
    switches = []
    for canon, rec in seen.items():
        sel = eager.prepare(rec.op, rec.tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout)
        switches.append(in_model.Switch(rec.op, canon, sel, rec.alpha, rec.beta, rec.out_layout))
    return switches


def test_each_problem_is_decided_on_its_own_forward_time(monkeypatch):
    """Recorded verdicts: the first pick saves 10% of the forward, the second costs 5%."""
    _numba_winners(monkeypatch)
    gemmtune.patch(net := Net())
    x = torch.randn(7, 24)
    switches = _switches(net, x)
    assert len(switches) == 2

    def measure(forward, iters):
        forward()
        first, second = (sw.on_library for sw in switches)
        return iters * (1.0 + (0.1 if first else 0.0) - (0.05 if second else 0.0))

    verdicts = in_model.check_in_model(lambda: net(x), switches, margin=0.01, measure=measure)
    assert [v.kept for v in verdicts] == [True, False]
    assert verdicts[0].ratio == pytest.approx(1.1) and verdicts[1].ratio == pytest.approx(0.95 / 1.0)
    assert [sw.on_library for sw in switches] == [False, True]
    (layer_fn,) = patching._LINEAR.values()  # the patched layer's problem kept its numba kernel
    assert switches[0].pick in [c.cell_contents for c in layer_fn.__closure__ or ()]
    assert TABLE.runner("mm", switches[1].canon) is torch.mm
    with torch.no_grad():
        torch.testing.assert_close(net(x), _reference(net, x), rtol=1e-4, atol=1e-4)
    switches[1].library(False)  # and back: the pick runs again
    assert TABLE.runner("mm", switches[1].canon) is switches[1].pick


def test_a_tie_within_the_margin_goes_to_torch(monkeypatch):
    _numba_winners(monkeypatch)
    gemmtune.patch(net := Net())
    x = torch.randn(3, 24)
    switches = _switches(net, x)
    verdicts = in_model.check_in_model(lambda: net(x), switches, margin=0.01,
                                       measure=lambda fn, n: n * (1.005 if switches[0].on_library else 1.0))
    assert not verdicts[0].kept and verdicts[0].ratio == pytest.approx(1.005)


def test_a_pick_faster_in_only_half_the_rounds_goes_to_torch(monkeypatch):
    """Median 1.04, but the lower quartile below 1: not faster in three rounds out of four."""
    _numba_winners(monkeypatch)
    gemmtune.patch(net := Net())
    x = torch.randn(3, 24)
    switches = _switches(net, x)[:1]
    calls = {"n": 0}

    def measure(forward, iters):
        calls["n"] += 1
        if not switches[0].on_library:
            return float(iters)
        return iters * (1.10 if (calls["n"] // 2) % 2 else 0.98)  # alternate: 10% faster, 2% slower

    (verdict,) = in_model.check_in_model(lambda: net(x), switches, margin=0.01, measure=measure)
    assert verdict.ratio > 1.01 and verdict.q1 < 1.0 and not verdict.kept


def test_a_forward_that_fails_when_run_again_leaves_the_tuned_picks(monkeypatch, caplog):
    """A stateful forward (here: it refuses a second call) must not break the warm-up."""
    _numba_winners(monkeypatch)

    class Once(Net):
        calls = 0

        def forward(self, x):
            Once.calls += 1
            if Once.calls == 2:  # the first forward after the recording one
                raise RuntimeError("cache full")
            return super().forward(x)

    net, x = Once(), torch.randn(4, 24)
    with caplog.at_level("WARNING", logger="gemmtune"):
        report = gemmtune.warmup(net, x, progress=False, in_model=True)
    assert all(r.in_model is None and r.runs.startswith("numba") for r in report.rows)
    assert "in-model check skipped" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(net(x), _reference(net, x), rtol=1e-4, atol=1e-4)
    (layer_fn,) = patching._LINEAR.values()
    assert layer_fn is not torch.nn.functional.linear  # the layer runs its numba pick


def test_picks_that_each_look_faster_but_slow_the_forward_together_all_go_to_torch(monkeypatch):
    """Recorded timings: each pick alone times 3% faster, yet the forward with both is 4% slower
    (what the H200 showed at one token: a pick's effect is smaller than the drift between blocks)."""
    _numba_winners(monkeypatch)
    gemmtune.patch(net := Net())
    x = torch.randn(7, 24)
    switches = _switches(net, x)

    def measure(forward, iters):
        forward()
        on = [sw.on_library for sw in switches]
        if all(on):
            return float(iters)
        if not any(on):
            return iters * 1.04
        return iters * 0.97 if on.count(True) == 1 else float(iters)

    verdicts = in_model.check_in_model(lambda: net(x), switches, margin=0.01, measure=measure)
    assert [v.kept for v in verdicts] == [False, False]
    assert all(v.together and v.ratio == pytest.approx(1 / 1.04) for v in verdicts)
    assert all(sw.on_library for sw in switches)
    with torch.no_grad():
        torch.testing.assert_close(net(x), _reference(net, x), rtol=1e-4, atol=1e-4)


def test_a_surviving_subset_that_loses_when_tested_together_goes_to_torch(monkeypatch):
    """Both picks together win; alone the first wins and the second loses; the first, kept by itself,
    then loses against torch's op for both (the drift moved on): the last test decides."""
    _numba_winners(monkeypatch)
    gemmtune.patch(net := Net())
    x = torch.randn(7, 24)
    switches = _switches(net, x)
    blocks = {"n": 0}
    earlier = 1 + 3 * in_model.ROUNDS * 2  # the first timing, then three tests of 16 rounds x 2 blocks

    def measure(forward, iters):
        blocks["n"] += 1
        first, second = (sw.on_library for sw in switches)
        if first == second:
            return iters * (1.05 if first else 1.0)  # torch's op for both / both picks
        if first:
            return iters * 1.02  # the second pick alone: the first alone saves 2%
        return iters * (0.99 if blocks["n"] <= earlier else 1.10)  # the first pick alone

    verdicts = in_model.check_in_model(lambda: net(x), switches, margin=0.01, measure=measure)
    assert blocks["n"] == earlier + in_model.ROUNDS * 2  # the subset was tested
    assert [v.kept for v in verdicts] == [False, False]
    assert verdicts[0].together and verdicts[0].ratio == pytest.approx(1.05 / 1.10)
    assert not verdicts[1].together and verdicts[1].ratio == pytest.approx(0.99)
    assert all(sw.on_library for sw in switches)
