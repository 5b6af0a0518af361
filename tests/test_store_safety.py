"""Store safety: processes killed mid-write, concurrent writers, corrupted files, read-only stores.

What must hold in every case: opening the store works; no pick committed
earlier is lost (where its pages are readable at all); no partial pick exists
(a pick without its timing rows); and the caller gets a store, never an
exception.  Stale picks (a template's source changed) are covered by
tests/test_store.py::test_changed_template_source_makes_its_entries_unused.

The writer subprocesses load `gemmtune/store.py` on its own (it imports only
the standard library at module level), so each starts in ~50 ms instead of
importing torch.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import gemmtune.store.sqlite as store_mod
from gemmtune.store.sqlite import Row, Store

STORE_PY = str(Path(store_mod.__file__).resolve())
ENV = "env0"
INFO = {"device": "test"}

LOADER = textwrap.dedent("""
    import importlib.util, os, sys, types
    root = os.path.dirname(os.path.dirname(STORE_PY_PATH))  # bare packages (no __init__ run), so that
    for name, where in (("gemmtune_alone", root), ("gemmtune_alone.store", os.path.join(root, "store")),
                        ("gemmtune_alone.core", os.path.join(root, "core"))):  # `from .marker`, `..core` work
        pkg = types.ModuleType(name)
        pkg.__path__ = [where]
        sys.modules[name] = pkg
    spec = importlib.util.spec_from_file_location("gemmtune_alone.store.sqlite", STORE_PY_PATH)
    st = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = st
    spec.loader.exec_module(st)
""")


def rows_for(i: int, n: int, ms_base: float = 1.0) -> list[Row]:
    return [Row("tmpl", "hash0", json.dumps({"c": j}, separators=(",", ":")), json.dumps({"g": 1}, separators=(",", ":")), ms_base + j + i, "ok", "final")
            for j in range(n)]


def no_partial_picks(path: Path, n_rows: int | None = None) -> None:
    """Every pick has its own timing row (and, when `n_rows` is given, every problem has all its rows)."""
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        orphans = db.execute(
            "SELECT count(*) FROM picks p WHERE NOT EXISTS (SELECT 1 FROM timings t WHERE t.env=p.env AND "
            "t.problem=p.problem AND t.template=p.template AND t.config=p.config AND t.runtime=p.runtime)").fetchone()[0]
        assert orphans == 0
        if n_rows is not None:
            counts = db.execute("SELECT problem, count(*) FROM timings GROUP BY env, problem").fetchall()
            assert all(n == n_rows for _, n in counts), [c for c in counts if c[1] != n_rows][:5]
            assert db.execute("SELECT count(*) FROM picks").fetchone()[0] == len(counts)
    finally:
        db.close()


def open_quietly(path: Path) -> Store:
    """Open the store and fail on any warning (a corruption or fall-back warning is a failure here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        store = Store(path)
    assert store.path == str(path) and not store.warnings
    return store


# -- (a) SIGKILL mid-write ------------------------------------------------------------------------------

WRITER = LOADER + textwrap.dedent("""
    import json
    path, tag, n_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print("start", flush=True)
    store = st.Store(path)
    i = 0
    while True:
        rows = [st.Row("tmpl", "hash0", json.dumps({"c": j}, separators=(",", ":")), json.dumps({"g": 1}, separators=(",", ":")), 1.0 + j + i, "ok", "final")
                for j in range(n_rows)]
        store.save("env0", {"device": "test"}, f"{tag}/p{i}", "d", rows, rows[i % n_rows], replace_pick=False)
        print(i, flush=True)  # committed: save() returned
        i += 1
""")


def test_sigkill_mid_write_loses_nothing_committed_and_leaves_no_partial_pick(tmp_path):
    path = tmp_path / "store.sqlite"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.replace("STORE_PY_PATH", repr(STORE_PY)))
    rng = random.Random(20240601)
    n_rows = 150  # a long transaction: most kills land inside one
    committed: dict[str, str] = {}  # problem -> the pick's config
    kills = 8
    for rnd in range(kills):
        proc = subprocess.Popen([sys.executable, str(script), str(path), f"r{rnd}", str(n_rows)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "start"
        time.sleep(rng.uniform(0.0, 0.3) if rnd else 0.005)  # round 0: killed while opening
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
        done = [int(x) for x in proc.stdout.read().split()]
        for i in done:
            committed[f"r{rnd}/p{i}"] = json.dumps({"c": i % n_rows}, separators=(",", ":"))

        store = open_quietly(path)  # no corruption warning, no fall-back
        for problem, pick_config in committed.items():
            stored = store.load(ENV, problem)
            assert stored.pick is not None and stored.pick.config == pick_config, problem
            assert len(stored.rows) == n_rows, problem
        store.close()
        no_partial_picks(path, n_rows)
    assert len(committed) > 0  # the writers got work done between kills


# -- (b) concurrent writers of one problem with different timings ------------------------------------------

RACER = LOADER + textwrap.dedent("""
    import json, time
    path, w, start_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    store = st.Store(path)
    rows = [st.Row("tmpl", "hash0", json.dumps({"c": j}, separators=(",", ":")), "{}", float(100 * (w + 1) + j), "ok", "final")
            for j in range(6)]
    while time.time() < start_at:
        time.sleep(0.001)
    got = store.save("env0", {"device": "test"}, "shared", "d", rows, rows[w % 6], replace_pick=False)
    print(json.dumps([got.config, got.ms]))
""")


def test_concurrent_writers_of_one_problem_agree_on_one_consistent_pick(tmp_path):
    """tests/test_store.py runs 8 real tunes on one store; this races 8 raw writers on ONE problem.

    Each writer has its own timings and its own pick.  Every writer must get the
    same pick back, the store must hold one row per choice, and the stored pick
    must be consistent with the stored timings (both from the same writer).
    """
    path = tmp_path / "store.sqlite"
    Store(path).close()  # created up front: the race is on the rows, not on creating the file
    script = tmp_path / "racer.py"
    script.write_text(RACER.replace("STORE_PY_PATH", repr(STORE_PY)))
    start_at = time.time() + 1.0
    procs = [subprocess.Popen([sys.executable, str(script), str(path), str(w), str(start_at)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(8)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outs]
    answers = {o[0].strip() for o in outs}
    assert len(answers) == 1, answers
    config, ms = json.loads(answers.pop())
    db = sqlite3.connect(path)
    rows = db.execute("SELECT config, ms FROM timings WHERE problem='shared'").fetchall()
    assert len(rows) == 6 and len({c for c, _ in rows}) == 6  # one row per choice
    writer = {int(m) // 100 - 1 for _, m in rows}
    assert len(writer) == 1  # every row from one writer: rows and pick were one transaction
    w = writer.pop()
    assert config == json.dumps({"c": w % 6}, separators=(",", ":")) and ms == float(100 * (w + 1) + w % 6)
    assert db.execute("SELECT count(*) FROM picks").fetchone()[0] == 1


# -- (c) corrupted files -------------------------------------------------------------------------------------

def _filled(path: Path, n: int = 200, n_rows: int = 8) -> dict[str, str]:
    store = Store(path)
    picks = {}
    for i in range(n):
        rows = rows_for(i, n_rows)
        store.save(ENV, INFO, f"p{i}", "d", rows, rows[i % n_rows], replace_pick=False)
        picks[f"p{i}"] = rows[i % n_rows].config
    store.close()
    return picks


def _overwrite(path: Path, offset: int, size: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(random.Random(offset).randbytes(size))


CORRUPTIONS = {
    "garbage_file": lambda p: p.write_bytes(b"this is not a database" * 100),
    "truncated_header": lambda p: os.truncate(p, 50),
    "truncated_half": lambda p: os.truncate(p, os.path.getsize(p) // 2),
    "garbage_header": lambda p: _overwrite(p, 0, 100),
    "garbage_page": lambda p: _overwrite(p, 4096, 4096),
    "garbage_last_page": lambda p: _overwrite(p, os.path.getsize(p) - 4096, 4096),
}


# A file whose header is gone cannot be told from another app's file: it is left alone
# (tests/test_reliability_store.py); these keep gemmtune's marker in the header.
UNRECOGNISABLE = ("garbage_file", "truncated_header", "garbage_header")


@pytest.mark.parametrize("kind", [k for k in CORRUPTIONS if k not in UNRECOGNISABLE])
def test_corrupted_store_is_moved_aside_rebuilt_and_salvaged(tmp_path, kind):
    path = tmp_path / "store.sqlite"
    picks = _filled(path)
    CORRUPTIONS[kind](path)
    with pytest.warns(RuntimeWarning, match="corrupted"):
        store = Store(path)
    assert store.path == str(path)  # rebuilt on disk, not a fall-back to memory
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("store.sqlite.corrupt-")]
    kept = {p: store.load(ENV, p).pick for p in picks}
    for problem, pick in kept.items():  # whatever survived is exactly what was written
        assert pick is None or pick.config == picks[problem]
    if kind in ("garbage_page", "garbage_last_page"):
        assert sum(p is not None for p in kept.values()) > 0  # one bad page does not lose every pick
    rows = rows_for(999, 8)
    store.save(ENV, INFO, "after", "d", rows, rows[0], replace_pick=False)
    store.close()
    no_partial_picks(path)
    again = open_quietly(path)  # the rebuilt store is healthy and keeps the new pick
    assert again.load(ENV, "after").pick.config == rows[0].config
    again.close()


def test_zero_length_file_is_an_empty_store_not_a_corruption(tmp_path):
    """SQLite reads a 0-byte file as an empty database (what a crash right after creating it leaves)."""
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"")
    store = open_quietly(path)
    rows = rows_for(0, 4)
    store.save(ENV, INFO, "p", "d", rows, rows[1], replace_pick=False)
    store.close()
    assert open_quietly(path).load(ENV, "p").pick.config == rows[1].config


def test_corruption_found_after_opening_is_recovered_on_the_next_read(tmp_path, monkeypatch):
    """A damaged page the open-time check did not see: load() recovers instead of raising."""
    path = tmp_path / "store.sqlite"
    picks = _filled(path)
    _overwrite(path, os.path.getsize(path) // 2 // 4096 * 4096, 4096)  # a page of timing rows
    monkeypatch.setattr(store_mod, "_check_integrity", lambda db: None)  # let the open succeed
    store = Store(path)
    assert store.path == str(path) and not store.warnings
    rows = rows_for(5, 8)
    with pytest.warns(RuntimeWarning, match="corrupted"):
        got = {p: store.load(ENV, p).pick for p in picks}
        assert store.save(ENV, INFO, "after", "d", rows, rows[0], replace_pick=False).config == rows[0].config
    assert store.path == str(path)
    assert any(g is not None for g in got.values())
    assert all(g is None or g.config == picks[p] for p, g in got.items())
    store.close()
    monkeypatch.undo()
    no_partial_picks(path)


# -- (d) read-only stores --------------------------------------------------------------------------------------
#
# As root, file modes do not stop writes.  So the store is opened by a forked child that first drops to
# the `nobody` user (uid/gid 65534): the directory and file modes then really refuse writes, and SQLite
# reports a read-only database, which is the code path a read-only cache directory takes.  Without
# root the modes apply directly.  (A path under a regular file, the other unwritable location, is
# tests/test_store.py::test_unwritable_location_falls_back_to_memory.)

def _unprivileged(fn):
    """Run `fn()` as a user the file modes apply to; returns its JSON-able result (or 'EXC ...')."""
    if os.geteuid() != 0:
        return fn()
    if not hasattr(os, "fork"):
        pytest.skip("needs fork to drop root privileges")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            result = fn()
        except BaseException as exc:  # noqa: BLE001
            result = f"EXC {type(exc).__name__}: {exc}"
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    data = b""
    deadline = time.time() + 60
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return json.loads(data)


@pytest.fixture
def shared_dir():
    """A directory the `nobody` user can reach (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="gemmtune-ro-"))
    d.chmod(0o755)
    yield d
    for p in [d, *d.rglob("*")]:
        try:
            p.chmod(0o755 if p.is_dir() else 0o644)
        except OSError:
            pass
    shutil.rmtree(d, ignore_errors=True)


def _use_store(path: Path, problems: list[str]):
    def run():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store = Store(path)
            before = {p: (store.load(ENV, p).pick.config if store.load(ENV, p).pick else None) for p in problems}
            rows = rows_for(7, 4)
            stored = store.save(ENV, INFO, "new-problem", "d", rows, rows[2], replace_pick=False)
            new = store.load(ENV, "new-problem").pick
            return {"path": store.path, "before": before, "stored": stored.config,
                    "new": new.config if new else None, "warnings": [str(w.message) for w in caught]}
    return run


@pytest.mark.parametrize("dir_mode,file_mode", [(0o555, 0o444), (0o555, 0o666), (0o777, 0o444)],
                         ids=["read_only_dir_and_file", "read_only_dir", "read_only_file"])
def test_read_only_store_serves_earlier_picks_and_keeps_new_ones_in_memory(shared_dir, dir_mode, file_mode):
    store_dir = shared_dir / "cache"
    store_dir.mkdir()
    path = store_dir / "store.sqlite"
    picks = _filled(path, n=20)
    before_bytes = path.read_bytes()
    path.chmod(file_mode)
    store_dir.chmod(dir_mode)
    res = _unprivileged(_use_store(path, list(picks)))
    assert isinstance(res, dict), res  # no exception reached the caller
    assert res["path"] == ":memory:"
    assert res["before"] == picks  # every earlier pick is still served
    assert res["stored"] == res["new"] == json.dumps({"c": 2}, separators=(",", ":"))  # new picks work, in memory
    assert any("not writable" in w and "20 picks" in w for w in res["warnings"]), res["warnings"]
    assert path.read_bytes() == before_bytes  # nothing was written to the read-only store
