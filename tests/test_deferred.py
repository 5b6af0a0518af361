"""Store hits whose generated picks are built later, together (`gemmtune.measure.deferred`): in a warm-up
from a warm store, each generated pick's kernel is built in one parallel step instead of one by one.

Real tunes on CPU: a store answers a numba pick beside the library kernel (the stored pick is made numba's
by a wrapper of the store's recall: which kernel wins on a loaded CPU is not what these tests read)."""

from __future__ import annotations

import logging
import sys
import threading

import pytest
import torch

import gemmtune
import gemmtune.engine as engine
from gemmtune.measure import deferred

pytest.importorskip("numba")
POOL = ("extern", "numba")


@pytest.fixture
def numba_pick(tmp_path, monkeypatch):
    """A store that holds this test's problem, answering numba's kernel as its pick."""
    settings = gemmtune.Settings(store=str(tmp_path / "store.db"), backends=POOL, isolation="off")
    a, b = torch.randn(24, 16), torch.randn(16, 8)
    engine.tune("mm", a, b, settings=settings, progress=False)
    real = engine.recall

    def numba_answered(*args, **kwargs):
        memory = real(*args, **kwargs)
        memory.pick = next((c for c in memory.known if c.template_uid == "numba_mm"), memory.pick)
        return memory

    monkeypatch.setattr(engine, "recall", numba_answered)
    return settings, a, b


def test_a_store_hit_inside_deferring_builds_its_generated_pick_only_when_asked(numba_pick):
    settings, a, b = numba_pick
    with deferred.deferring() as pending:
        sel = engine.tune("mm", a, b, settings=settings, progress=False)
    assert sel.cache_hit and sel.winner.template_uid == "numba_mm"
    assert len(pending) == 1 and not pending[0].built
    assert deferred.build_all(pending) == 1 and pending[0].built and deferred.build_all(pending) == 0
    torch.testing.assert_close(sel(a, b), a @ b, rtol=1e-5, atol=1e-5)
    with deferred.deferring() as later:  # a library pick is built at once: nothing deferred
        engine.recall, real = (lambda *x, **k: _library(real(*x, **k))), engine.recall
        try:
            assert engine.tune("mm", a, b, settings=settings, progress=False).winner.is_extern
        finally:
            engine.recall = real
    assert later == []


def _library(memory):
    memory.pick = next(c for c in memory.known if c.is_extern)
    return memory


def test_outside_deferring_a_store_hit_builds_at_once(numba_pick):
    settings, a, b = numba_pick
    sel = engine.tune("mm", a, b, settings=settings, progress=False)
    assert sel.cache_hit and sel.winner.template_uid == "numba_mm"
    torch.testing.assert_close(sel(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_a_pick_that_fails_to_build_runs_the_library_kernel_with_a_warning(numba_pick, monkeypatch, caplog):
    from gemmtune.templates.cpu_numba import NumbaMMTemplate

    settings, a, b = numba_pick
    with deferred.deferring() as pending:
        sel = engine.tune("mm", a, b, settings=settings, progress=False)

    def broken(self, choice, ki, example):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(NumbaMMTemplate, "compile", broken)
    with caplog.at_level(logging.WARNING, logger="gemmtune"):
        deferred.build_all(pending)
    assert "failed to build" in caplog.text and "library kernel runs it" in caplog.text
    torch.testing.assert_close(sel(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_a_warm_up_from_the_store_builds_its_generated_picks_together(numba_pick, monkeypatch):
    settings, _, _ = numba_pick
    monkeypatch.setenv("GEMMTUNE_STORE", settings.store)
    monkeypatch.setenv("GEMMTUNE_ISOLATION", "off")
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(16, 8, bias=False), torch.nn.Linear(8, 4)), torch.randn(24, 16)
    want = model(x)
    seen, real = [], deferred.build_all
    monkeypatch.setattr(deferred, "build_all", lambda pending, **kw: seen.append([d.built for d in pending])
                        or real(pending, **kw))
    gemmtune.warmup(model, x, backends=POOL, in_model=False, release=False)  # tuned: nothing deferred
    gemmtune.unpatch(model)
    gemmtune.clear_dispatch_cache()
    gemmtune.warmup(model, x, backends=POOL, in_model=False, release=False)  # the store answers numba's picks
    assert seen == [[], [], [False, False], [True, True]]  # built together at once; nothing left at the end
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    gemmtune.unpatch(model)


def test_a_deferred_launcher_builds_once_under_racing_callers_and_keeps_no_builder():
    built = []

    def build():
        built.append(threading.get_ident())
        return lambda tensors, out=None, **rt: ("ran", rt)

    with deferred.deferring() as pending:
        later = deferred.defer(None, build, None, "mm(2x2, 2x2)")
    threads = [threading.Thread(target=later.launcher) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and pending == [later] and later(("x",), swizzle=4) == ("ran", {"swizzle": 4})
    assert later.bound(("x",)) is None  # the built launcher binds nothing: the caller keeps the general one


def test_nothing_is_deferred_outside_a_block_or_for_a_store_shared_between_machines():
    class Shared:
        shared = True

    assert deferred.defer(None, lambda: None, None, "mm") is None
    with deferred.deferring() as pending:
        assert deferred.defer(Shared(), lambda: None, None, "mm") is None
    assert pending == []


def test_a_failed_build_without_a_fallback_raises():
    with deferred.deferring():
        later = deferred.defer(None, lambda: 1 / 0, None, "mm")
    with pytest.raises(ZeroDivisionError):
        later.launcher()


def test_a_standing_in_pick_runs_its_library_kernel_unbuilt_and_builds_once_the_block_ends():
    built = []

    def build():
        built.append(1)
        return lambda tensors, out=None, **rt: ("pick", rt)

    with deferred.deferring() as pending:
        later = deferred.defer(None, build, lambda: (lambda tensors, out=None: "library"), "mm", key="k")
    with deferred.standing_in(["k"]):
        assert later(("x",), swizzle=4) == "library" and later.bound(("x",)) is None
        assert deferred.build_all(pending, skip={"k"}) == 0 and not later.built and built == []
    with deferred.standing_in(["another"]):
        assert later(("x",), swizzle=4) == ("pick", {"swizzle": 4}) and built == [1]
    with deferred.standing_in(["k"]):  # built: the pick runs
        assert later(("x",)) == ("pick", {})
    later.release()  # built: nothing to release
    assert not later.released and later(("x",)) == ("pick", {})


def test_a_released_pick_runs_its_library_kernel_with_one_warning_and_drops_its_build(caplog):
    with deferred.deferring() as pending:
        later = deferred.defer(None, lambda: 1 / 0, lambda: (lambda tensors, out=None: "library"), "mm(2x2, 2x2)",
                               key=deferred.pick_key("mm(2x2, 2x2)/k", "numba"))
    assert deferred.release(pending, {"another"}) == 0 and not later.released
    assert deferred.release(pending, {later.key}) == 1 and later.released and later._build is None
    with caplog.at_level(logging.WARNING, logger="gemmtune"):
        assert later(("x",), swizzle=4) == "library" and later(("x",)) == "library"
    assert caplog.text.count("never built") == 1


def test_build_all_builds_only_the_keys_asked_for():
    with deferred.deferring() as pending:
        for key in "abc":
            deferred.defer(None, lambda: (lambda tensors, out=None: None), None, "mm", key=key)
    assert deferred.build_all(pending, only={"a", "b"}, skip={"b"}) == 1
    assert [d.built for d in pending] == [True, False, False]


@pytest.fixture
def to_torch(numba_pick, monkeypatch):
    """The store of `numba_pick` for every warm-up, and an in-model check that sends every pick to torch's op
    (decided here); the picks each check was asked about."""
    from gemmtune.dispatch.in_model import InModel

    monkeypatch.setenv("GEMMTUNE_STORE", numba_pick[0].store)
    monkeypatch.setenv("GEMMTUNE_ISOLATION", "off")
    checks = []

    def check(forward, switches, *, margin, cuda):
        checks.append([sw.selection.problem.M for sw in switches])
        for sw in switches:
            sw.library(True)
        return [InModel(sw.selection.problem.describe(), sw.selection.winner.name, 0.5, False, 0.4) for sw in switches]

    monkeypatch.setattr(sys.modules["gemmtune.dispatch.checking"], "check_in_model", check)
    return checks


def _warm_store_warm_ups(model, x, monkeypatch, checks, **options):
    """A warm-up that tunes, then two from the store (numba's picks: checked and their verdicts kept, then those
    verdicts applied); (the last one's report, the lists of deferred picks its builds were handed).  `checks`
    is left holding what the last one's check was asked (nothing, where the kept verdicts apply)."""
    gemmtune.warmup(model, x, backends=POOL, release=False, **options)  # tuned: which kernel wins is not read here
    pendings, real = [], deferred.build_all
    monkeypatch.setattr(deferred, "build_all", lambda pending, **kw: pendings.append(pending) or real(pending, **kw))
    for _ in range(2):
        gemmtune.unpatch(model)
        gemmtune.clear_dispatch_cache()
        pendings.clear()
        checks.clear()
        report = gemmtune.warmup(model, x, backends=POOL, release=False, **options)
    return report, pendings


def test_a_warm_up_never_builds_a_pick_its_kept_verdict_sends_to_torch(to_torch, monkeypatch):
    torch.manual_seed(0)
    model, x = torch.nn.Linear(16, 8, bias=False), torch.randn(24, 16)
    want = model(x)
    checks = to_torch
    report, pendings = _warm_store_warm_ups(model, x, monkeypatch, checks)
    assert checks == [], "the kept verdict was timed again"
    phases = report.phases()  # where the warm-up's time went: the parts add up to its wall time
    assert list(phases) == ["forward", "tune", "build", "check", "rest"] and min(phases.values()) >= -0.005
    assert sum(phases.values()) == pytest.approx(report.seconds, abs=0.01) and "builds" in report.table()
    assert report.rows[0].winner.startswith("numba") and report.rows[0].in_model.stored
    assert not report.rows[0].in_model.kept
    later = pendings[-1]
    assert len(later) == 1 and later[0].released, "the pick its kept verdict sends to torch's op was built"
    with torch.no_grad():
        torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    assert later[0].released
    gemmtune.unpatch(model)


def test_a_range_warm_up_builds_no_bucket_pick_its_kept_verdicts_send_to_torch(to_torch, monkeypatch):
    torch.manual_seed(0)
    model, x = torch.nn.Linear(16, 8, bias=False), torch.randn(24, 16)
    want = {m: (xm := torch.randn(m, 16), model(xm)) for m in (1, 2, 4, 8, 24)}
    checks = to_torch
    report, pendings = _warm_store_warm_ups(model, x, monkeypatch, checks, m=range(1, 9),
                                            inputs_at=lambda m: want[m][0])
    assert checks == [], "a kept verdict was timed again"
    later = pendings[-1]
    assert len(later) == 5 and all(d.released for d in later), "a pick its kept verdict sends to torch's op was built"
    assert all(r.in_model is not None and r.in_model.stored and not r.in_model.kept for r in report.rows)
    with torch.no_grad():
        for xm, out in want.values():
            torch.testing.assert_close(model(xm), out, rtol=1e-5, atol=1e-5)
    assert all(d.released for d in later)
    gemmtune.unpatch(model)
