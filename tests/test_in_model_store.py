"""The in-model check's verdicts kept in the store (dispatch/verdicts.py): a warm store's warm-up of the
same model, picks and machine applies them and times nothing."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune import engine
from gemmtune.dispatch import in_model, patching, verdicts
from gemmtune.dispatch.table import TABLE
from gemmtune.store.locations import open_store, shared_store
from helpers import TwoGemmNet as Net
from redis_server import RedisServer, require_redis

pytestmark = pytest.mark.usefixtures("memory_store")
CHECKING = sys.modules["gemmtune.dispatch.checking"]



class Other(Net):
    """The same problems in another model."""


@pytest.fixture
def numba_picks(monkeypatch):
    real = engine.tune
    monkeypatch.setattr(engine, "tune", lambda op, *t, backends=None, **kw: real(op, *t, backends=("numba",), **kw))


@pytest.fixture
def checks(monkeypatch):
    """The check, with a verdict decided here: the layer's pick stays, the direct call's goes to torch's op."""
    calls = []

    def check(forward, switches, *, margin, cuda):
        calls.append(len(switches))
        out = []
        for sw in switches:
            keep = sw.selection.problem.describe().startswith("mm(6x24")
            sw.library(not keep)
            out.append(in_model.InModel(sw.selection.problem.describe(), sw.selection.winner.name,
                                        1.5 if keep else 0.5, keep, 1.4 if keep else 0.4))
        return out

    monkeypatch.setattr(CHECKING, "check_in_model", check)
    return calls


def _runs(net: Net, x: torch.Tensor, monkeypatch) -> tuple[list, list]:
    """(layer calls of torch's F.linear, direct calls of torch.mm) in one forward."""
    with torch.no_grad():
        net(x)  # the layer's first call after the check finds its runner
    linear, mm = [], []
    monkeypatch.setattr(patching, "_linear", lambda *a: linear.append(1) or torch.nn.functional.linear(*a))
    TABLE.replace_runner("mm", torch.mm, lambda a, b: mm.append(1) or torch.mm(a, b))
    with torch.no_grad():
        out = net(x)
    torch.testing.assert_close(out, torch.relu(x @ net.lin.weight.t()) @ net.w2, rtol=1e-4, atol=1e-4)
    return linear, mm


def test_a_warm_store_applies_the_kept_verdicts_without_timing(numba_picks, checks, monkeypatch):
    x = torch.randn(6, 24)
    first = gemmtune.warmup(Net(), x, progress=False)
    assert checks == [2] and [r.in_model.stored for r in first.rows] == [False, False]
    gemmtune.clear_dispatch_cache()  # a new process on a machine that shares the store
    net = Net()
    second = gemmtune.warmup(net, x, progress=False)
    assert checks == [2], "the kept verdicts were timed again"
    assert all(r.from_store for r in second.rows)
    assert [(r.in_model.kept, r.in_model.stored) for r in second.rows] == [(True, True), (False, True)]
    assert [r.runs.startswith("numba") for r in second.rows] == [True, False]
    assert "store" in second.table()
    assert _runs(net, x, monkeypatch) == ([], [1])  # the layer runs its pick, the direct call torch's op


def test_in_model_true_times_again_and_later_warm_ups_read_the_newest(numba_picks, checks, monkeypatch):
    x = torch.randn(6, 24)
    gemmtune.warmup(Net(), x, progress=False)
    gemmtune.clear_dispatch_cache()
    again = gemmtune.warmup(Net(), x, progress=False, in_model=True)
    assert checks == [2, 2] and not any(r.in_model.stored for r in again.rows)

    def keep_all(forward, switches, *, margin, cuda):
        checks.append(len(switches))
        for sw in switches:
            sw.library(False)
        return [in_model.InModel(sw.selection.problem.describe(), sw.selection.winner.name, 1.5, True, 1.4)
                for sw in switches]

    monkeypatch.setattr(CHECKING, "check_in_model", keep_all)
    gemmtune.clear_dispatch_cache()
    gemmtune.warmup(Net(), x, progress=False, in_model=True)
    gemmtune.clear_dispatch_cache()
    net = Net()
    last = gemmtune.warmup(net, x, progress=False)
    assert checks == [2, 2, 2] and [(r.in_model.kept, r.in_model.stored) for r in last.rows] == [(True, True)] * 2
    assert _runs(net, x, monkeypatch) == ([], [])


def test_another_model_or_other_picks_are_timed(numba_picks, checks):
    x = torch.randn(6, 24)
    gemmtune.warmup(Net(), x, progress=False)
    gemmtune.clear_dispatch_cache()
    gemmtune.warmup(Other(), x, progress=False)
    assert checks == [2, 2]
    gemmtune.clear_dispatch_cache()
    gemmtune.warmup(Net(), torch.randn(5, 24), progress=False)  # other problems
    assert checks == [2, 2, 2]
    gemmtune.clear_dispatch_cache()
    gemmtune.warmup(Net(), x, progress=False, in_model=False)
    assert checks == [2, 2, 2]


def test_unreadable_kept_verdicts_are_timed_again(numba_picks, checks, caplog):
    x = torch.randn(6, 24)
    gemmtune.warmup(Net(), x, progress=False)
    store = shared_store("memory")
    (key,) = [k for k in _keys(store) if k.startswith(verdicts.PREFIX)]
    store.put_kernel_files(key, {"verdicts-99999999999999999999.json": b"[{\"problem\": 1}"})
    gemmtune.clear_dispatch_cache()
    with caplog.at_level("WARNING", logger="gemmtune"):
        report = gemmtune.warmup(Net(), x, progress=False)
    assert checks == [2, 2] and "could not be read" in caplog.text
    assert not any(r.in_model.stored for r in report.rows)


def _keys(store) -> list[str]:
    return [row[0] for row in store._db.execute("SELECT DISTINCT key FROM kernel_files")]


def test_the_key_covers_the_model_the_calls_the_picks_and_the_margin():
    sel = gemmtune.tune("mm", torch.randn(4, 3), torch.randn(3, 2), backends=("extern",))
    other = gemmtune.tune("mm", torch.randn(5, 3), torch.randn(3, 2), backends=("extern",))
    base = verdicts.verdict_key(Net(), [("mm", sel, 2)], 0.01)
    wider = Net()
    wider.norm = nn.LayerNorm(16)  # the same GEMMs among other layers
    variants = [verdicts.verdict_key(Other(), [("mm", sel, 2)], 0.01),
                verdicts.verdict_key(wider, [("mm", sel, 2)], 0.01),
                verdicts.verdict_key(Net(), [("mm", sel, 3)], 0.01),
                verdicts.verdict_key(Net(), [("mm", other, 2)], 0.01),
                verdicts.verdict_key(Net(), [("mm", sel, 2)], 0.02),
                verdicts.verdict_key(Net(), [("mm", sel, 2), ("fp8", None, 1)], 0.01)]
    assert base is not None and len({base, *variants}) == 7
    torch.set_num_threads(torch.get_num_threads() + 1)
    try:
        assert verdicts.verdict_key(Net(), [("mm", sel, 2)], 0.01) != base  # the check weighs host time
    finally:
        torch.set_num_threads(torch.get_num_threads() - 1)
    assert verdicts.verdict_key(Net(), [("mm", sel, 2), ("mm", other, 1)], 0.01) == verdicts.verdict_key(
        Net(), [("mm", other, 1), ("mm", sel, 2)], 0.01)  # the order problems are met in does not matter
    assert verdicts.verdict_key(Net(), [("fp8", None, 1)], 0.01) is None


def test_a_redis_store_keeps_the_verdicts_and_serves_the_newest(monkeypatch):
    require_redis()
    srv = RedisServer().start()
    try:
        store = open_store(srv.url(prefix=f"v{os.getpid()}"))
        first = [in_model.InModel("mm(1x8, 8x8)", "triton_gemv", 0.9, False, 0.8)]
        verdicts.keep(store, "K", first, ["mm|1x8|8x8"])
        assert verdicts.kept(store, "K") == {("mm|1x8|8x8", "triton_gemv"): dataclasses.replace(first[0], stored=True)}
        verdicts.keep(store, "K", [dataclasses.replace(first[0], kept=True, ratio=1.2, q1=1.1)], ["mm|1x8|8x8"])
        assert [v.kept for v in verdicts.kept(store, "K").values()] == [True]
    finally:
        srv.stop()
    down = open_store("redis://127.0.0.1:1/0?timeout=0.05")
    with pytest.warns(RuntimeWarning, match="did not answer"):
        assert verdicts.kept(down, "K") is None


def test_a_forward_that_fails_before_the_kept_verdicts_apply_leaves_the_tuned_picks(numba_picks, checks, caplog):
    x = torch.randn(6, 24)
    gemmtune.warmup(Net(), x, progress=False)
    gemmtune.clear_dispatch_cache()

    class Once(Net):
        calls = 0

        def forward(self, x):
            Once.calls += 1
            if Once.calls == 2:  # the forward after the recording one
                raise RuntimeError("cache full")
            return super().forward(x)

    Once.__qualname__ = Net.__qualname__  # the same model for the key
    Once.__module__ = Net.__module__
    with caplog.at_level("WARNING", logger="gemmtune"):
        report = gemmtune.warmup(Once(), x, progress=False)
    assert checks == [2] and "not applied" in caplog.text
    assert all(r.in_model is None and r.runs.startswith("numba") for r in report.rows)


GOOD_ROW = {"problem_key": "mm|1x8|8x8", "problem": "mm(1x8, 8x8)", "winner": "triton_gemv", "ratio": 1.2, "kept": True,
            "q1": 1.1, "together": False}


@pytest.mark.parametrize("rows", [
    [{**GOOD_ROW, "ratio": "fast"}],
    [{**GOOD_ROW, "kept": "yes"}],
    [{**GOOD_ROW, "q1": -1.0}],
    [{**GOOD_ROW, "stored": True, "extra": 1}],
    [{k: v for k, v in GOOD_ROW.items() if k != "winner"}],
    [[1, 2]],
    {"rows": []},
], ids=["ratio_text", "kept_text", "negative", "unknown_keys", "no_winner", "row_a_list", "not_a_list"])
def test_malformed_kept_verdicts_are_not_found_with_one_line_naming_the_store_and_key(rows, caplog):
    import json

    store = open_store("memory")
    store.put_kernel_files(verdicts.PREFIX + "K", {"verdicts-00000000000000000001.json": json.dumps(rows).encode()})
    with caplog.at_level("WARNING", logger="gemmtune"):
        assert verdicts.kept(store, "K") is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert store.path in line and verdicts.PREFIX + "K" in line
    store.put_kernel_files(verdicts.PREFIX + "K", {"verdicts-00000000000000000002.json": json.dumps([GOOD_ROW]).encode()})
    assert [v.ratio for v in verdicts.kept(store, "K").values()] == [1.2]  # the newest, well formed
