"""Whatever a shared store answers runs only after the correctness gate, on every path: the three routes
by which a poisoned store ran a wrong kernel (a partial hit, a provisional re-check, the re-tune after a
drop) on a SQLite file and a real redis-server; when a SQLite file counts as shared; a store another
process keeps locked."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import warnings
from dataclasses import replace

import pytest
import torch

import gemmtune
from gemmtune.core.choices import Choice, Timing
from gemmtune.core.settings import Settings
from gemmtune.measure.bench import Bench
from gemmtune.measure.compile import CompileResult
from gemmtune.store import locations
from gemmtune.store.keys import Row, canon
from gemmtune.store.locations import open_store
from gemmtune.store.memory import StoreKey
from gemmtune.store.sqlite import Store
from gemmtune.store.trust import Trust, others_may_write
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate
from redis_server import server  # noqa: F401 - server: a fixture

WRONG = "gave a wrong result"


class FastWrong(ScriptedTemplate):
    """ScriptedTemplate as a wrong kernel that is also fast: it writes zeros (a kernel that skips its
    work), so it beats torch's own kernel in any re-time.  Four choices: two configs, two runtimes."""

    def __init__(self) -> None:
        super().__init__("fastwrong", mode="wrong")

    def compile(self, choice, ki, example):
        self.compiled.append(choice.binary_key)

        def launch(tensors, out=None, group=1):
            a, b = tensors[-2], tensors[-1]
            res = out if out is not None else torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)
            return res.zero_()

        return launch


@pytest.fixture(params=["sqlite", "redis"])
def shared(request, tmp_path):
    """(location, settings) of a shared store: a SQLite file under store_shared="on", or a Redis server."""
    if request.param == "sqlite":
        where = str(tmp_path / "s.sqlite")
        return where, Settings(store=where, store_shared="on", strategy="exhaustive")
    where = request.getfixturevalue("server").url(prefix=f"gate{uuid.uuid4().hex[:12]}")
    return where, Settings(store=where, strategy="exhaustive")


def _mats():
    torch.manual_seed(7)
    return torch.randn(192, 160), torch.randn(160, 128)


def _tune(settings: Settings) -> gemmtune.Selection:
    a, b = _mats()
    return gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), FastWrong()], settings=settings)


def _new_process(monkeypatch) -> None:
    """What a new process sees: no stores opened (so nothing checked), an empty dispatch dict."""
    monkeypatch.setattr(locations, "_STORES", {})
    gemmtune.clear_dispatch_cache()


def _poison(location: str, route: str) -> None:
    """A writer of the store (through the store's own API) makes the wrong kernel's rows look ok and fast."""
    store = open_store(location)
    [entry] = store.problems()
    env, problem = entry["env"], entry["problem"]
    stored = store.load(env, problem)
    bad = sorted((r for r in stored.rows if r.template == "fastwrong"), key=lambda r: (r.config, r.runtime))
    assert len(bad) == 4 and all(r.status == "wrong_result" for r in bad)  # the honest tune caught them all
    fast = [replace(r, ms=1e-6, status="ok", stage="final") for r in bad]
    for r in bad[:2] if route == "retune_after_drop" else bad[:1]:
        store.forget(env, problem, r)  # rows already there win a save: dropped first (the pick with them)
    if route == "partial_hit":  # the pick names the wrong kernel, and one other row is gone
        store.forget(env, problem, bad[3])
        store.save(env, {}, problem, "d", [fast[0]], replace(fast[0], stage="exhaustive"), replace_pick=True)
    elif route == "provisional_recheck":  # only its row flipped to ok, and the (right) pick marked provisional
        store.save(env, {}, problem, "d", [fast[0]], stored.pick, replace_pick=True, provisional="1-0@0")
    else:  # a full hit on the wrong kernel, and a second poisoned row for the re-tune after the drop
        store.save(env, {}, problem, "d", fast[:2], replace(fast[0], stage="exhaustive"), replace_pick=True)


@pytest.mark.parametrize("route", ["partial_hit", "provisional_recheck", "retune_after_drop"])
def test_a_poisoned_shared_store_never_runs_a_wrong_kernel_and_names_the_entry(shared, route, monkeypatch):
    location, settings = shared
    a, b = _mats()
    assert _tune(settings).winner.template_uid == "aten_mm"
    _poison(location, route)
    _new_process(monkeypatch)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sel = _tune(settings)
    torch.testing.assert_close(sel(a, b), a @ b)
    assert sel.winner.template_uid == "aten_mm"
    caught = [str(w.message) for w in seen if WRONG in str(w.message)]
    if location.startswith("redis") and route == "provisional_recheck":
        # A Redis store is never held alone (docs/SCALE.md, one answer per problem): its provisional
        # pick is served as stored, after the first-use check, and the poisoned row decides nothing.
        assert sel.cache_hit and not caught
    else:
        assert caught and all(open_store(location).path in m and "fastwrong" in m for m in caught), caught
    _new_process(monkeypatch)
    again = _tune(settings)  # the store holds a right pick again
    assert again.winner.template_uid == "aten_mm"
    torch.testing.assert_close(again(a, b), a @ b)


def test_a_full_hit_on_a_poisoned_timing_row_is_checked_too(shared, monkeypatch):
    """A pick the store names from a row of its own that says ok runs only after the check."""
    location, settings = shared
    _tune(settings)
    _poison(location, "retune_after_drop")
    _new_process(monkeypatch)
    with pytest.warns(RuntimeWarning, match=WRONG):
        sel = _tune(settings)
    assert not sel.cache_hit and sel.winner.template_uid == "aten_mm"


def test_a_pick_another_process_stored_first_is_checked_before_it_runs(shared):
    """Between this tune's read and its write, a writer stores a wrong pick first: the pick the store
    returns is checked before it runs, dropped, and this tune's own pick goes in."""
    location, settings = shared
    a, b = _mats()
    key = StoreKey.of(gemmtune.KernelInputs.from_tensors("mm", a, b))
    wrong = Row("fastwrong", FastWrong().src_hash, canon({"TILE": 8}), canon({"group": 1}), 1e-6, "ok", "final")

    def race(event, **info):
        if event == "choices":  # recalled: nothing stored yet
            open_store(location).save(key.env, dict(key.info), key.problem, key.describe, [wrong], wrong, False)

    with pytest.warns(RuntimeWarning, match=WRONG):
        sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), FastWrong()], settings=settings, listener=race)
    torch.testing.assert_close(sel(a, b), a @ b)
    assert open_store(location).load(key.env, key.problem).pick.template == sel.winner.template_uid


class _Runner:
    """A runner that knows which choices are wrong and records what the interleaved re-time runs."""

    isolation = "off"

    def __init__(self, wrong):
        self.wrong, self.interleaved = wrong, []

    def check(self, choice):
        return "relative error 1.00e+00 > 1e-04" if choice in self.wrong else None

    def time(self, choice, stage, *, check):
        return Timing(choice, 1.0, stage)

    def time_interleaved(self, choices, rounds):
        self.interleaved.append(list(choices))
        return [Timing(c, 1.0, "finalist") for c in choices]

    def close(self):
        pass


def test_the_interleaved_retime_checks_a_stored_finalist_before_it_runs_it():
    bad, lib = Choice("fastwrong", "h", family="numba"), Choice("aten_mm", None)
    runner, told = _Runner({bad}), []
    known = {bad: Timing(bad, 1e-6, "store"), lib: Timing(lib, 1.0, "store")}
    bench = Bench(None, runner, CompileResult(), known=known, device_type="cuda",
                  on_wrong=lambda c, why: told.append(c))
    assert bench.measure([bad, lib], "final") == [1e-6, 1.0]  # stored timings rank without running
    assert bench.retime([bad, lib], 3) == [float("inf"), 1.0]
    assert runner.interleaved == [[lib]] and told == [bad]
    assert bench.records[bad].status == "wrong_result" and lib in bench.verified and not bench.recalled(lib)


# -- when a SQLite file counts as shared ----------------------------------------------------------------

def _rewritten_pick(tmp_path, monkeypatch, mode: int, **settings) -> tuple[gemmtune.Selection, list[str]]:
    """Tune into a SQLite file, rewrite its pick to the wrong kernel, set the file's mode and tune again
    (a new process)."""
    path = tmp_path / "store.sqlite"
    config = Settings(store=str(path), strategy="exhaustive", **settings)
    _tune(config)
    _poison(str(path), "retune_after_drop")
    path.chmod(mode)
    _new_process(monkeypatch)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sel = _tune(config)
    return sel, [str(w.message) for w in seen if WRONG in str(w.message)]


@pytest.mark.parametrize("mode,settings", [(0o666, {}), (0o600, {"store_shared": "on"})],
                         ids=["other_writable_file", "store_shared_on"])
def test_a_pick_rewritten_in_a_shared_sqlite_file_is_checked_and_dropped(tmp_path, monkeypatch, mode, settings):
    sel, caught = _rewritten_pick(tmp_path, monkeypatch, mode, **settings)
    a, b = _mats()
    torch.testing.assert_close(sel(a, b), a @ b)
    assert caught and str(tmp_path / "store.sqlite") in caught[0]


def test_a_pick_rewritten_in_a_private_sqlite_file_is_trusted_as_the_users_own_cache(tmp_path, monkeypatch):
    """Only this user can write the file: it is the user's own cache, served as a plain hit (docs/RELIABILITY.md)."""
    sel, caught = _rewritten_pick(tmp_path, monkeypatch, 0o600)
    assert sel.cache_hit and sel.winner.template_uid == "fastwrong" and not caught


def test_a_sqlite_file_is_shared_when_another_user_may_write_it(tmp_path):
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    mine = own / "s.sqlite"
    Store(mine).close()
    mine.chmod(0o600)
    assert others_may_write(mine) is None and not Store(mine).shared
    assert Store(mine, trust=Trust(shared="on")).shared
    mine.chmod(0o664)
    assert "group- or other-writable" in others_may_write(mine)
    mine.chmod(0o600)
    link = tmp_path / "link.sqlite"
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # anyone may replace the file there
    (open_dir / "s.sqlite").touch(mode=0o600)
    link.symlink_to(open_dir / "s.sqlite")
    assert "symbolic link" in others_may_write(link)
    open_dir.chmod(0o1777)  # sticky (as /tmp): others may add files, not replace ours
    assert others_may_write(open_dir / "s.sqlite") is None
    if os.geteuid() == 0:  # as root, a file another user owns
        os.chown(mine, 65534, 65534)
        assert "owned by another user" in others_may_write(mine)
        os.chown(open_dir / "s.sqlite", 65534, 65534)
        assert "owned by another user" in others_may_write(open_dir / "s.sqlite")  # sticky: not ours


# -- a store another process keeps locked ---------------------------------------------------------------

HOLDER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # held until the test closes our stdin
"""


def test_a_store_locked_by_another_process_falls_back_to_memory_with_one_warning(tmp_path, monkeypatch):
    path = tmp_path / "store.sqlite"
    Store(path).close()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setenv("GEMMTUNE_STORE", str(path))
        monkeypatch.setenv("GEMMTUNE_STORE_LOCK_TIMEOUT_S", "0.5")
        a, b = torch.randn(24, 16), torch.randn(16, 8)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = gemmtune.mm(a, b, backends="extern")
        torch.testing.assert_close(out, a @ b)
        locked = [str(w.message) for w in seen if "locked by another process" in str(w.message)]
        assert len(locked) == 1 and locked[0].startswith(
            f"gemmtune: store {path} is locked by another process for more than 0.5 s; keeping picks in memory "
            "for this process"), locked
    finally:
        holder.stdin.close()
        holder.wait(30)
