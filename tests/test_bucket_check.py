"""The in-model check per bucket of a range warm-up (`warmup(model, x, m=..., inputs_at=...)`,
dispatch/checking.py): each bucket's picks are checked in the forward at that bucket's inputs, and a
pick the forward runs faster without runs torch's op for every M of its bucket.  Real numba and torch
kernels on CPU; the check's timing is a stand-in that decides by M (what it measures is tested in
test_in_model.py)."""

from __future__ import annotations

import dataclasses
import logging
import sys

import pytest
import torch

import gemmtune
from gemmtune import engine
from gemmtune.core.errors import InputError
from gemmtune.dispatch import eager, in_model, patching

pytestmark = pytest.mark.usefixtures("memory_store")
CHECKING = sys.modules["gemmtune.dispatch.checking"]
RANGE = range(1, 17)  # buckets 1, 2, 4, 8, 16


@pytest.fixture(autouse=True)
def numba_picks(monkeypatch):
    """Every tune picks one numba kernel (the same every time: no timing decides), torch's op timed beside it
    (as a tune of the whole pool where numba won); a bucket's pick built for a new M (a `keep_only`
    finalize) sees the whole pool."""
    gemmtune.clear_dispatch_cache()
    real = engine.tune

    def tune(op, *tensors, backends=None, finalize=(), **kw):
        if finalize or (backends is not None and "numba" not in backends):
            return real(op, *tensors, backends=backends, finalize=finalize, **kw)
        first = lambda ki, choices, op_name: [min(choices, key=lambda c: c.key)]  # noqa: E731 - picks stay put
        sel = real(op, *tensors, backends=("numba",), finalize=[first], **kw)
        if backends is not None and "extern" not in backends:
            return sel
        library = real(op, *tensors, backends=("extern",), **kw)
        return dataclasses.replace(sel, timings=sel.timings + library.timings)

    monkeypatch.setattr(engine, "tune", tune)
    yield
    gemmtune.clear_dispatch_cache()


@pytest.fixture
def checks(monkeypatch):
    """The check, deciding here: a pick stays where the forward's M is 8 or more (the GPU-bound side), else
    it goes to torch's op.  Records the M of every problem it was asked about."""
    asked = []

    def check(forward, switches, *, margin, cuda):
        forward()  # as the check's first forward: patched layers remember the pick
        out = []
        for sw in switches:
            m = sw.selection.problem.M
            asked.append(m)
            sw.library(m < 8)
            out.append(in_model.InModel(sw.selection.problem.describe(), sw.selection.winner.name,
                                        1.2 if m >= 8 else 0.8, m >= 8, 1.1 if m >= 8 else 0.7))
        return out

    monkeypatch.setattr(CHECKING, "check_in_model", check)
    return asked


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 16, bias=False))


def _winner_at(m: int) -> str:
    (sel,) = [s for s in eager.selections().values() if s.problem.M == m]
    return sel.winner.template_uid


def test_each_bucket_is_checked_in_the_model_and_a_losing_pick_runs_torch_for_its_whole_bucket(checks):
    model = _model()
    report = gemmtune.warmup(model, torch.randn(16, 24), progress=False, release=False, m=RANGE,
                             inputs_at=lambda m: torch.randn(m, 24))
    assert sorted(checks) == [1, 2, 4, 8, 16]  # the example's M, then every other bucket's forward
    verdicts = {r.problem: r.in_model for r in report.rows if r.in_model is not None}
    assert {p: v.kept for p, v in verdicts.items()} == {f"mm({m}x24, 24x16)": m >= 8 for m in (1, 2, 4, 8, 16)}
    tunes = gemmtune.dispatch_stats()["tunes"]
    with torch.no_grad():
        for m in (3, 6, 12):  # buckets 4 (torch's op), 8 and 16 (the numba picks)
            x = torch.randn(m, 24)
            torch.testing.assert_close(model(x), x @ model[0].weight.t())
    assert _winner_at(3) == "aten_mm" and _winner_at(6).startswith("numba") and _winner_at(12).startswith("numba")
    assert gemmtune.dispatch_stats()["tunes"] == tunes  # nothing tuned on the hot path


def test_a_layer_whose_every_bucket_goes_to_torch_is_released(monkeypatch):
    def torch_everywhere(forward, switches, *, margin, cuda):
        forward()
        for sw in switches:
            sw.library(True)
        return [in_model.InModel(sw.selection.problem.describe(), sw.selection.winner.name, 0.8, False, 0.7)
                for sw in switches]

    monkeypatch.setattr(CHECKING, "check_in_model", torch_everywhere)
    model = _model()
    report = gemmtune.warmup(model, torch.randn(16, 24), progress=False, m=RANGE,
                             inputs_at=lambda m: torch.randn(m, 24))
    assert report.released == ("0",)
    linear = []
    monkeypatch.setattr(patching, "_linear", lambda *a: linear.append(1) or torch.nn.functional.linear(*a))
    with torch.no_grad():
        model(torch.randn(5, 24))
    assert linear == []  # released: the layer is torch's own again, no patched path at all


def test_without_inputs_at_the_examples_verdict_applies_to_its_bucket(checks):
    model = _model()
    gemmtune.warmup(model, torch.randn(4, 24), progress=False, release=False, m=RANGE)
    assert checks == [4]  # the other buckets are not checked in the model
    with torch.no_grad():
        model(torch.randn(3, 24))  # bucket 4: the example's verdict, torch's op
        model(torch.randn(6, 24))  # bucket 8: unchecked, its tuned pick
    assert _winner_at(3) == "aten_mm" and _winner_at(6).startswith("numba")


def test_a_forward_that_fails_at_a_bucket_is_named_and_the_other_buckets_are_checked(checks, caplog):
    def inputs_at(m: int) -> torch.Tensor:
        if m == 2:
            raise ValueError("no inputs at 2")
        return torch.randn(m, 24)

    with caplog.at_level(logging.WARNING, logger="gemmtune"):
        gemmtune.warmup(_model(), torch.randn(16, 24), progress=False, release=False, m=RANGE, inputs_at=inputs_at)
    assert sorted(checks) == [1, 4, 8, 16]
    assert "the forward at bucket M = 2 failed (ValueError: no inputs at 2)" in caplog.text


def test_a_warm_store_applies_the_kept_bucket_verdicts_without_timing(checks):
    model, x = _model(), torch.randn(16, 24)
    gemmtune.warmup(model, x, progress=False, release=False, m=RANGE, inputs_at=lambda m: torch.randn(m, 24))
    gemmtune.clear_dispatch_cache()
    checks.clear()
    again = gemmtune.warmup(model, x, progress=False, release=False, m=RANGE, inputs_at=lambda m: torch.randn(m, 24))
    assert checks == [] and all(r.in_model.stored for r in again.rows if r.in_model is not None)
    with torch.no_grad():
        model(torch.randn(3, 24))
    assert _winner_at(3) == "aten_mm"


@pytest.mark.parametrize("kwargs, message", [
    (dict(inputs_at=lambda m: torch.randn(m, 24)), "without m="),
    (dict(m=RANGE, inputs_at=torch.randn(4, 24)), "got Tensor"),
])
def test_inputs_at_must_be_a_function_with_a_range(kwargs, message):
    calls = []
    model = _model()
    model.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(InputError, match=f"^warmup: inputs_at must be a function of M.*{message}"):
        gemmtune.warmup(model, torch.randn(3, 24), progress=False, **kwargs)
    assert calls == []  # refused before the forward ran


def test_a_bucket_is_decided_once_and_the_examples_verdict_comes_first(checks):
    """The example's M (6) lies in bucket 8: its verdict decides bucket 8, which the forward at 8 does not
    time again, so every M of that bucket runs what the example's check chose."""
    model = _model()
    gemmtune.warmup(model, torch.randn(6, 24), progress=False, release=False, m=RANGE,
                    inputs_at=lambda m: torch.randn(m, 24))
    assert sorted(checks) == [1, 2, 4, 6, 16]
    with torch.no_grad():
        model(torch.randn(7, 24))
    assert _winner_at(7) == "aten_mm"


def test_two_problems_alike_but_for_their_backends_keep_their_own_rows(monkeypatch):
    """Layer 0 (patched with backends numba and extern) goes to torch's op, layer 1 (default backends) keeps
    its pick: one problem description, two rows, each with its own verdict."""
    def by_backends(forward, switches, *, margin, cuda):
        forward()
        out = []
        for sw in switches:
            keep = sw.selection.problem.M >= 8 or sw.canon[-2] is None
            sw.library(not keep)
            out.append(in_model.InModel(sw.selection.problem.describe(), sw.selection.winner.name, 1.0, keep, 1.0))
        return out

    monkeypatch.setattr(CHECKING, "check_in_model", by_backends)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 24, bias=False), torch.nn.Linear(24, 24, bias=False))
    gemmtune.patch(model[0], backends=("numba", "extern"))
    gemmtune.patch(model[1])
    report = gemmtune.warmup(model, torch.randn(3, 24), progress=False, release=False, m=range(1, 5),
                             inputs_at=lambda m: torch.randn(m, 24))
    verdicts = sorted((r.problem, r.in_model.kept) for r in report.rows if r.in_model is not None)
    # bucket 4 is the example's (M = 3): decided there, not at M = 4
    assert verdicts == sorted([(f"mm({m}x24, 24x24)", keep) for m in (1, 2, 3) for keep in (False, True)])


class _Keyword(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(24, 16, bias=False)

    def forward(self, *, x: torch.Tensor, scale: float) -> torch.Tensor:
        return self.lin(x) * scale


def test_inputs_at_may_give_keyword_inputs_over_the_examples(checks):
    model = _Keyword()
    gemmtune.warmup(model, x=torch.randn(16, 24), scale=2.0, progress=False, release=False, m=RANGE,
                    inputs_at=lambda m: {"x": torch.randn(m, 24)})
    assert sorted(checks) == [1, 2, 4, 8, 16]  # every bucket's forward ran, `scale` kept from the example


def test_an_environment_that_leaves_torchs_op_out_gets_no_check_and_no_torch_op(checks, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_BACKENDS", "numba")
    model = _model()
    gemmtune.warmup(model, torch.randn(16, 24), progress=False, release=False, m=RANGE,
                    inputs_at=lambda m: torch.randn(m, 24))
    assert checks == []
    with torch.no_grad():
        model(torch.randn(3, 24))
    assert _winner_at(3).startswith("numba")


def test_a_later_check_that_keeps_a_pick_sends_back_what_an_earlier_one_sent_to_torch(monkeypatch):
    """Warm-up 1's check sends both problems to torch's op; warm-up 2 (in_model=True) keeps them: the
    direct `gemmtune.mm` call and the patched layer run their picks again, not torch's op."""
    from gemmtune.dispatch.table import TABLE
    from helpers import TwoGemmNet

    def deciding(keep):
        def check(forward, switches, *, margin, cuda):
            forward()
            for sw in switches:
                sw.library(not keep)
            return [in_model.InModel(sw.selection.problem.describe(), sw.selection.winner.name, 1.0, keep, 1.0)
                    for sw in switches]
        return check

    net, x = TwoGemmNet(), torch.randn(6, 24)
    monkeypatch.setattr(CHECKING, "check_in_model", deciding(False))
    gemmtune.warmup(net, x, progress=False, release=False)
    direct = next(k for k, s in eager.selections().items() if s.problem.K == 16)
    assert TABLE.runner("mm", direct) is torch.mm
    monkeypatch.setattr(CHECKING, "check_in_model", deciding(True))
    report = gemmtune.warmup(net, x, progress=False, release=False, in_model=True)
    assert all(r.in_model.kept for r in report.rows)
    assert TABLE.runner("mm", direct) is not torch.mm
    linear = []
    monkeypatch.setattr(patching, "_linear", lambda *a: linear.append(1) or torch.nn.functional.linear(*a))
    with torch.no_grad():
        out = net(x)
    torch.testing.assert_close(out, torch.relu(x @ net.lin.weight.t()) @ net.w2, rtol=1e-4, atol=1e-4)
    assert linear == []  # the layer runs its pick
