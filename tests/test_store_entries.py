"""Every entry read from a store goes through one schema (store/entry.py), on SQLite and on a real
redis-server: a malformed, oversized or (with a key) unsigned entry is skipped with one warning naming
the store and the key, counted, listed by `gemmtune cache check`, and replaced by the next tune."""

from __future__ import annotations

import json
import sqlite3
import tracemalloc
import uuid
import warnings

import pytest
import torch

import gemmtune
from gemmtune.core.settings import Settings
from gemmtune.dispatch.eager import dispatched
from gemmtune.store import entry
from gemmtune.store.keys import Row
from gemmtune.store.locations import open_store
from gemmtune.store.trust import Trust

from redis_server import fresh_location, server  # noqa: F401 - server: a fixture

KEY_A = "fleet-key-aaaaaaaaaaaaaaaa"
KEY_B = "fleet-key-bbbbbbbbbbbbbbbb"


@pytest.fixture(params=["sqlite", "redis"])
def where(request, tmp_path):
    """A fresh store location of each kind."""
    return fresh_location(request, tmp_path, request.param, "e")


def _client(where: str):
    import redis

    return redis.Redis.from_url(where.split("?")[0], decode_responses=True)


def _prefix(where: str) -> str:
    return where.split("prefix=")[1]


def _new_process(monkeypatch, key: str | None = None):
    """What a new process sees (no store opened, an empty dispatch dict), with `key` as its store key."""
    monkeypatch.setattr(gemmtune.store.locations, "_STORES", {})
    gemmtune.clear_dispatch_cache()
    if key is None:
        monkeypatch.delenv("GEMMTUNE_STORE_KEY", raising=False)
    else:
        monkeypatch.setenv("GEMMTUNE_STORE_KEY", key)


def _mats(m: int = 24):
    torch.manual_seed(m)
    return torch.randn(m, 16), torch.randn(16, 8)


def _tune(where: str, m: int = 24, key: str | None = None, **kw):
    a, b = _mats(m)
    sel = gemmtune.tune("mm", a, b, backends=("extern", "numpy"), settings=Settings(store=where, store_key=key), **kw)
    torch.testing.assert_close(sel(a, b), a @ b)
    return sel


def _skips(caught) -> list[str]:
    return [str(w.message) for w in caught if "skipped" in str(w.message)]


def _one_problem(where: str) -> tuple[str, str]:
    """(env, problem) of the only problem stored at `where`."""
    if where.startswith("redis"):
        [key] = _client(where).keys(f"{_prefix(where)}:pick:*")
        env, problem = key.split(":", 3)[2:]
        return env, problem
    [(env, problem)] = sqlite3.connect(where).execute("SELECT env, problem FROM picks").fetchall()
    return env, problem


def _check(where: str, capsys, key: str | None = None) -> tuple[int, str]:
    from gemmtune.cli import main

    capsys.readouterr()
    code = main(["cache", "--store", where, "check"])
    out = capsys.readouterr()
    assert "internal error" not in out.out + out.err
    return code, out.out


# -- finding 3: malformed entries ------------------------------------------------------------------------
# Each corrupts the store after one tune and names a piece of the key its warning must carry.

def _redis_corrupt(where: str, kind: str) -> str:
    c, p = _client(where), _prefix(where)
    env, problem = _one_problem(where)
    rows, pick, prov = (f"{p}:{k}:{env}:{problem}" for k in ("rows", "pick", "prov"))
    stored = json.loads(c.get(pick))
    field = json.dumps([stored["template"], stored["config"], stored["runtime"]])
    value = json.loads(c.hget(rows, field))
    if kind == "row_field_not_json":
        c.hset(rows, "{not json", c.hget(rows, field))
        return f"{rows} field"
    if kind == "row_value_not_json":
        c.hset(rows, field, "not json")
    elif kind == "row_without_src_hash":
        c.hset(rows, field, json.dumps({k: v for k, v in value.items() if k != "src_hash"}))
    elif kind == "ms_fast":
        c.hset(rows, field, json.dumps({**value, "ms": "fast"}))
    elif kind == "pick_not_json":
        c.set(pick, "{garbage")
        return pick
    elif kind == "pick_lacks_keys":
        c.set(pick, json.dumps({k: v for k, v in stored.items() if k != "template"}))
        return pick
    elif kind == "mark_not_a_time":
        c.set(prov, "x@notatime")
        return prov
    return f"{rows} field"


def _sqlite_corrupt(where: str, kind: str) -> str:
    db = sqlite3.connect(where)
    env, problem = _one_problem(where)
    t, cfg, rt = db.execute("SELECT template, config, runtime FROM picks").fetchone()
    row = "WHERE env=? AND problem=? AND template=? AND config=? AND runtime=?"
    args = (env, problem, t, cfg, rt)
    if kind == "text_ms":
        db.execute(f"UPDATE timings SET ms='fast' {row}", args)
    elif kind == "config_not_json":
        db.execute(f"UPDATE timings SET config='{{not json' {row}", args)
    elif kind == "status_unknown":
        db.execute(f"UPDATE timings SET status='great' {row}", args)
    elif kind == "pick_not_json":
        db.execute("UPDATE picks SET config='{not json'")
    elif kind == "mark_not_a_time":
        db.execute("INSERT OR REPLACE INTO provisional_picks(env, problem, run) VALUES (?, ?, 'x@notatime')",
                   (env, problem))
    db.commit()
    db.close()
    return {"pick_not_json": "picks[", "mark_not_a_time": "provisional_picks["}.get(kind, "timings[")


CASES = [("redis", k) for k in ("row_field_not_json", "row_value_not_json", "row_without_src_hash", "ms_fast",
                                "pick_not_json", "pick_lacks_keys", "mark_not_a_time")]
CASES += [("sqlite", k) for k in ("text_ms", "config_not_json", "status_unknown", "pick_not_json", "mark_not_a_time")]
REPLACED = {"row_value_not_json", "row_without_src_hash", "ms_fast", "pick_not_json", "pick_lacks_keys", "text_ms",
            "status_unknown"}  # the next tune writes over them


@pytest.mark.parametrize("backend, kind", CASES, ids=[f"{b}-{k}" for b, k in CASES])
def test_a_malformed_entry_is_skipped_with_one_warning_naming_the_store_and_key(backend, kind, tmp_path, capsys,
                                                                               monkeypatch, request):
    where = (str(tmp_path / "s.sqlite") if backend == "sqlite"
             else request.getfixturevalue("server").url(prefix=f"m{uuid.uuid4().hex[:12]}"))
    _tune(where)
    key = (_redis_corrupt if backend == "redis" else _sqlite_corrupt)(where, kind)
    code, out = _check(where, capsys)
    assert code == 1 and key in out and "1 bad" in out, out
    for action in (["ls"], ["show", "24x16"], ["export", str(tmp_path / "out.json")]):  # readers never crash
        from gemmtune.cli import main

        nothing_listed = action[0] == "show" and kind.startswith("pick_")  # the bad pick was the only one
        assert main(["cache", "--store", where, *action]) == (1 if nothing_listed else 0)
    _new_process(monkeypatch)
    monkeypatch.setenv("GEMMTUNE_STORE", where)
    a, b = _mats(24)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out_mm = gemmtune.mm(a, b, backends=("extern", "numpy"))
    torch.testing.assert_close(out_mm, a @ b)
    retuned = dispatched("mm", (a, b), backends=("extern", "numpy"))[0]  # may pick another library kernel
    skipped = _skips(caught)
    assert len(skipped) == 1 and key in skipped[0], skipped
    store_path = open_store(where).path
    assert store_path in skipped[0] and (backend == "sqlite" or "redis://" in skipped[0])
    if kind in REPLACED:  # the tune after the skip wrote a good entry over the bad one
        assert _check(where, capsys)[0] == 0
        _new_process(monkeypatch)
        hit = _tune(where)  # the store answers with what the tune after the skip stored (a provisional pick,
        assert hit.winner.key == retuned.winner.key or retuned.provisional  # a close call under load: timed again)
        assert hit.cache_hit or retuned.provisional


def test_a_malformed_index_member_is_listed_and_never_crashes_ls(server, capsys, monkeypatch):
    from gemmtune.cli import main

    where = server.url(prefix=f"i{uuid.uuid4().hex[:12]}")
    _tune(where)
    _client(where).zadd(f"{_prefix(where)}:index", {"not json": 0, '["only-one"]': 1})
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["cache", "--store", where, "ls"]) == 0
    assert "mm(24x16, 16x8)" in capsys.readouterr().out
    assert len([m for m in _skips(caught) if ":index member" in m]) == 2
    code, out = _check(where, capsys)
    assert code == 1 and out.count(":index member") == 2 and "2 bad" in out


def test_cache_check_of_a_good_store_exits_0_and_of_an_unreadable_one_exits_2(where, capsys, tmp_path):
    from gemmtune.cli import main

    _tune(where)
    code, out = _check(where, capsys)
    assert code == 0 and "all good" in out
    if where.startswith("redis"):
        unreachable = f"redis://127.0.0.1:1/0?timeout=0.05&prefix=x"
        assert main(["cache", "--store", unreachable, "check"]) == 2
    else:
        foreign = tmp_path / "notes.sqlite"
        foreign.write_text("not a database" * 20)
        assert main(["cache", "--store", str(foreign), "check"]) == 2
    assert "cannot be read" in capsys.readouterr().err or where.startswith("redis")


def test_a_sqlite_problem_over_the_row_bound_is_refused_whole_and_replaced(tmp_path):
    path = tmp_path / "s.sqlite"
    store = open_store(str(path))
    rows = [Row("aten_mm", None, "{}", json.dumps({"i": i}, separators=(",", ":")), 1.0, "ok")
            for i in range(entry.MAX_PROBLEM_ROWS + 1)]
    store.save("env", {}, "p", "d", rows[:1], rows[0], replace_pick=False)
    db = sqlite3.connect(path)
    db.executemany("INSERT OR IGNORE INTO timings(env, problem, template, src_hash, config, runtime, ms, status, "
                   "recorded) VALUES ('env', 'p', ?, NULL, ?, ?, 1.0, 'ok', 0)",
                   [(r.template, r.config, r.runtime) for r in rows])
    db.commit()
    reader = open_store(str(path))
    with pytest.warns(RuntimeWarning, match="more than 4096 rows"):
        assert reader.load("env", "p").rows == ()
    assert len(reader.bad_entries) == 1
    reader.save("env", {}, "p", "d", rows[:2], rows[0], replace_pick=True)
    assert len(open_store(str(path)).load("env", "p").rows) == 2


# -- finding 4: what Python writes, the server's scripts take ------------------------------------------------

def test_a_lone_surrogate_in_a_stored_row_does_not_jam_the_saves(server, monkeypatch):
    where = server.url(prefix=f"s{uuid.uuid4().hex[:12]}")
    _tune(where)
    c, p = _client(where), _prefix(where)
    env, problem = _one_problem(where)
    rows = f"{p}:rows:{env}:{problem}"
    for field in c.hkeys(rows):  # every stored row now names a source hash with a lone surrogate ("\ud800")
        c.hset(rows, field, json.dumps({**json.loads(c.hget(rows, field)), "src_hash": "stale\ud800"}))
    _new_process(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _tune(where)  # re-times every choice and writes over the rows
    assert not [w for w in caught if "did not" in str(w.message) or "refused" in str(w.message)]
    assert all("\\ud800" not in v for v in c.hvals(rows))
    _new_process(monkeypatch)
    assert _tune(where).cache_hit


# -- finding 5: reads are bounded before anything is loaded -------------------------------------------------------

def test_a_huge_redis_value_is_refused_without_being_loaded(server):
    where = server.url(prefix=f"h{uuid.uuid4().hex[:12]}")
    store = open_store(where)
    pick = Row("aten_mm", None, "{}", "{}", 1.0, "ok")
    store.save("env", {}, "p", "d", [pick], pick, replace_pick=False)
    huge = entry.MAX_PROBLEM_BYTES + (1 << 20)  # a few MB: over the bound of a problem's rows
    c, p = _client(where), _prefix(where)
    c.hset(f"{p}:rows:env:p", "big", "x" * huge)
    c.set(f"{p}:pick:env:q", "y" * (entry.MAX_ENTRY_BYTES * 8))
    reader = open_store(where)
    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got, other = reader.load("env", "p"), reader.load("env", "q")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.rows == () and other.pick is None
    assert peak < entry.MAX_ENTRY_BYTES * 4, peak  # neither value reached this process
    assert sum("over the size bounds" in m for m in _skips(caught)) == 2
    again = reader.save("env", {}, "p", "d", [pick], pick, replace_pick=True)  # the save drops the huge hash
    assert again == pick and open_store(where).load("env", "p").rows == (pick,)


def test_a_huge_sqlite_value_is_refused_in_the_query(tmp_path):
    path = tmp_path / "s.sqlite"
    store = open_store(str(path))
    pick = Row("aten_mm", None, "{}", "{}", 1.0, "ok")
    store.save("env", {}, "p", "d", [pick], pick, replace_pick=False)
    db = sqlite3.connect(path)
    db.execute("UPDATE picks SET describe=?", ("d" * (entry.MAX_PROBLEM_BYTES + (1 << 20)),))
    db.commit()
    tracemalloc.start()
    try:
        with pytest.warns(RuntimeWarning, match="describe is over the size bound"):
            got = open_store(str(path)).load("env", "p")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.pick is None and peak < entry.MAX_ENTRY_BYTES * 4, peak


def test_cache_check_lists_templates_gemmtune_does_not_ship_and_configs_outside_their_space(tmp_path, capsys):
    from gemmtune.inductor.timed import PREFIX
    from gemmtune.store.catalog import INDUCTOR_PREFIX

    assert INDUCTOR_PREFIX == PREFIX
    where = str(tmp_path / "s.sqlite")
    store = open_store(where)
    problem = "mm(8x4, 4x2)/float32/0123456789abcdef|out=row"
    rows = [Row("aten_mm", None, "{}", "{}", 1.0, "ok"), Row("mine", None, "{}", "{}", 2.0, "ok"),
            Row("aten_mm", None, '{"BLOCK_M":64}', "{}", 3.0, "ok"), Row("inductor:triton::mm", None, "{}", "{}", 4.0, "ok")]
    store.save("env", {}, problem, "d", rows, rows[0], replace_pick=False)
    code, out = _check(where, capsys)
    assert code == 1 and "2 bad" in out, out
    assert "template 'mine' is not one gemmtune ships" in out and "a library kernel has no config" in out
