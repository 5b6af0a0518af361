"""Store hits whose generated picks are built later, together (`gemmtune.measure.deferred`): in a warm-up
from a warm store, each generated pick's kernel is built in one parallel step instead of one by one.

Real tunes on CPU: a store answers a numba pick beside the library kernel (the stored pick is made numba's
by a wrapper of the store's recall: which kernel wins on a loaded CPU is not what these tests read)."""

from __future__ import annotations

import logging
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
    monkeypatch.setattr(deferred, "build_all", lambda pending: seen.append([d.built for d in pending]) or real(pending))
    gemmtune.warmup(model, x, backends=POOL, in_model=False, release=False)  # tuned: nothing deferred
    gemmtune.unpatch(model)
    gemmtune.clear_dispatch_cache()
    gemmtune.warmup(model, x, backends=POOL, in_model=False, release=False)  # the store answers numba's picks
    assert seen == [[], [False, False]]
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
