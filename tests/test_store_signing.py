"""Signed stores (store/signing.py, store/entry.py), on SQLite and on a real redis-server: with a key,
every entry written is signed and only entries that verify are read; an unsigned, forged or moved
entry is skipped with a warning naming the store and the key, and the next tune replaces it."""

from __future__ import annotations

import json
import sqlite3
import uuid
import warnings

import pytest
import torch

import gemmtune
from gemmtune.core.settings import Settings
from gemmtune.store.keys import Row
from gemmtune.store.locations import open_store
from gemmtune.store.marker import APPLICATION_ID, SCHEMA
from gemmtune.store.signing import Signer
from gemmtune.store.trust import Trust

from redis_server import fresh_location, server  # noqa: F401 - server: a fixture

OLD, NEW = "the-old-fleet-key-0123456789", "the-new-fleet-key-0123456789"
PICK = Row("aten_mm", None, "{}", "{}", 1.0, "ok", "final")
ROWS = [PICK, Row("numpy_blas", None, "{}", "{}", 2.0, "ok", "final")]


@pytest.fixture(params=["sqlite", "redis"])
def where(request, tmp_path):
    """A fresh store location of each kind."""
    return fresh_location(request, tmp_path, request.param, "g")


def _store(where: str, key: str | None = None):
    """A new store object on `where` (as another process would open it) reading under `key`."""
    return open_store(where, Trust(Signer.from_text(key) if key else None))


def _skipped(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if "skipped" in str(w.message)]


def test_a_reader_with_a_key_skips_unsigned_entries_and_a_writer_with_it_replaces_them(where):
    _store(where).save("env", {"device": "cpu"}, "p", "d", ROWS, PICK, False, provisional="run-1@1.0")
    assert _store(where).load("env", "p").pick == PICK  # without a key, nothing is required
    reader = _store(where, OLD)
    got, skipped = _skipped(lambda: reader.load("env", "p"))
    assert got.pick is None and got.rows == ()
    assert len(skipped) == 3 and all("not signed" in m and reader.path in m for m in skipped)
    assert len(reader.bad_entries) == 3
    # the tune that follows writes the same pick signed: it replaces the unsigned one
    assert reader.save("env", {"device": "cpu"}, "p", "d", ROWS, PICK, False) == PICK
    again, skipped = _skipped(lambda: _store(where, OLD).load("env", "p"))
    assert again.pick == PICK and set(again.rows) == set(ROWS) and not skipped


def test_a_pick_moved_to_another_problem_does_not_verify(where):
    signed = _store(where, OLD)
    other = Row("numpy_blas", None, "{}", "{}", 0.5, "ok", "final")
    signed.save("env", {}, "p1", "d1", [PICK], PICK, False)
    signed.save("env", {}, "p2", "d2", [other], other, False)
    if where.startswith("redis"):
        import redis

        c = redis.Redis.from_url(where.split("?")[0])
        prefix = where.split("prefix=")[1]
        c.set(f"{prefix}:pick:env:p2", c.get(f"{prefix}:pick:env:p1"))  # p1's signed pick, under p2
        c.hset(f"{prefix}:rows:env:p2", json.dumps(["aten_mm", "{}", "{}"]),
               c.hget(f"{prefix}:rows:env:p1", json.dumps(["aten_mm", "{}", "{}"])))
    else:
        db = sqlite3.connect(where)
        db.execute("DELETE FROM picks WHERE problem='p2'")
        db.execute("INSERT INTO picks SELECT env, 'p2', describe, template, src_hash, config, runtime, ms, strategy, "
                   "recorded, sig FROM picks WHERE problem='p1'")
        db.execute("INSERT INTO timings SELECT env, 'p2', template, src_hash, config, runtime, ms, status, stage, "
                   "recorded, sig FROM timings WHERE problem='p1'")
        db.commit()
    got, skipped = _skipped(lambda: _store(where, OLD).load("env", "p2"))
    assert got.pick is None and PICK not in got.rows and other in got.rows
    assert len(skipped) == 2 and all("does not verify" in m for m in skipped)
    assert _store(where).load("env", "p2").pick == PICK  # a reader without a key is not protected by signatures


def test_keys_rotate_the_first_signs_and_every_one_verifies(where):
    _store(where, OLD).save("env", {}, "old", "d", [PICK], PICK, False)
    _store(where, f"{NEW},{OLD}").save("env", {}, "new", "d", [PICK], PICK, False)
    both = _store(where, f"{NEW},{OLD}")
    assert both.load("env", "old").pick == PICK and both.load("env", "new").pick == PICK
    assert _store(where, NEW).load("env", "new").pick == PICK
    got, skipped = _skipped(lambda: _store(where, OLD).load("env", "new"))  # signed with the new key only
    assert got.pick is None and skipped


def test_a_writer_without_the_key_cannot_make_a_reader_with_it_run_its_entry(where, monkeypatch):
    from gemmtune.templates.extern import AtenTemplate
    from helpers import ScriptedTemplate

    a, b = torch.randn(24, 16), torch.randn(16, 8)
    bad = ScriptedTemplate("bad", mode="wrong")
    templates = [AtenTemplate("mm"), bad]
    keyed = Settings(store=where, store_key=OLD)
    sel = gemmtune.tune("mm", a, b, templates=templates, settings=keyed, strategy="exhaustive")
    assert sel.winner.template_uid == "aten_mm"
    wrong = next(t.choice for t in sel.timings if t.choice.template_uid == "bad")
    forged = Row("bad", wrong.src_hash, json.dumps(dict(wrong.config), separators=(",", ":")),
                 json.dumps(dict(wrong.runtime), separators=(",", ":")), 1e-6, "ok", "final")
    writer = _store(where)  # has the store, not the key: its pick and its fast row are unsigned
    writer.save(_env(where), {}, _problem(where), "d", [forged], forged, True)
    monkeypatch.setattr(gemmtune.store.locations, "_STORES", {})
    gemmtune.clear_dispatch_cache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = gemmtune.tune("mm", a, b, templates=templates, settings=keyed, strategy="exhaustive")
    torch.testing.assert_close(again(a, b), a @ b)
    messages = [str(w.message) for w in caught]
    assert again.winner.template_uid == "aten_mm"
    assert any("not signed" in m for m in messages)
    assert not any("wrong result" in m and "store" in m for m in messages)  # never taken as the stored pick
    assert _store(where, OLD).load(_env(where), _problem(where)).pick.template == "aten_mm"  # replaced, signed


def _env(where: str) -> str:
    return _key_parts(where)[0]


def _problem(where: str) -> str:
    return _key_parts(where)[1]


def _key_parts(where: str) -> tuple[str, str]:
    if where.startswith("redis"):
        import redis

        prefix = where.split("prefix=")[1]
        [key] = redis.Redis.from_url(where.split("?")[0], decode_responses=True).keys(f"{prefix}:pick:*")
        env, problem = key.split(":", 3)[2:]
        return env, problem
    [(env, problem)] = sqlite3.connect(where).execute("SELECT env, problem FROM picks").fetchall()
    return env, problem


def test_export_carries_signatures_and_import_signs_under_the_importers_key(where, tmp_path):
    _store(where, OLD).save("env", {"device": "cpu"}, "mm(8x4, 4x2)/float32/0123456789abcdef", "d", ROWS, PICK, False)
    data = _store(where, OLD).export()
    assert all(t["sig"].startswith("v1:") for e in data["entries"] for t in [e["pick"], *e["timings"]])
    target = str(tmp_path / "t.sqlite")
    assert _store(target, NEW).import_(data) == 1
    [p] = _store(target, NEW).problems()
    got = _store(target, NEW).load(p["env"], p["problem"])
    assert got.pick == PICK and set(got.rows) == set(ROWS)
    bad = json.loads(json.dumps(data))
    bad["entries"][0]["timings"][0]["ms"] = -1.0  # the file's form is right; the store's schema refuses it
    from gemmtune.core.errors import LookupTableError

    with pytest.raises(LookupTableError, match="entry 0 .*ms is -1.0, not a finite time"):
        _store(str(tmp_path / "u.sqlite"), NEW).import_(bad)


def test_a_store_of_the_earlier_schema_opens_gains_signatures_and_keeps_its_picks(tmp_path):
    path = tmp_path / "v1.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA.replace(", sig TEXT", ""))  # schema 1: no signatures
    db.execute(f"PRAGMA application_id={APPLICATION_ID}")
    db.execute("CREATE TABLE gemmtune_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO gemmtune_meta VALUES ('schema_version', '1')")
    db.execute("INSERT INTO timings VALUES ('env','p','aten_mm',NULL,'{}','{}',1.0,'ok','final',0)")
    db.execute("INSERT INTO picks VALUES ('env','p','d','aten_mm',NULL,'{}','{}',1.0,'final',0)")
    db.commit()
    db.close()
    store = open_store(str(path))
    assert store.path == str(path) and not store.warnings and store.load("env", "p").pick == PICK
    store.save("env", {}, "q", "d", [PICK], PICK, False)
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM gemmtune_meta").fetchone()[0] == "2"
    assert {r[1] for r in db.execute("PRAGMA table_info(picks)")} >= {"sig"}


def test_a_row_forged_into_a_signed_hash_is_skipped_and_the_others_still_verify(server):
    import redis

    where = server.url(prefix=f"w{uuid.uuid4().hex[:12]}")
    rows = [Row("numba_mm", "h", json.dumps({"TILE": 8 * i}, separators=(",", ":")), "{}", float(i), "ok", "final")
            for i in range(1, 7)]
    _store(where, OLD).save("env", {}, "p", "d", rows, rows[0], False)
    _store(where, OLD).save("env", {}, "q", "d", rows, rows[0], False)
    c, prefix = redis.Redis.from_url(where.split("?")[0]), where.split("prefix=")[1]
    assert c.hexists(f"{prefix}:rows:env:p", "sig")  # the whole hash is signed: one MAC verifies its rows
    c.hset(f"{prefix}:rows:env:q", "sig", c.hget(f"{prefix}:rows:env:p", "sig"))  # another problem's: no use
    got, skipped = _skipped(lambda: _store(where, OLD).load("env", "q"))
    assert set(got.rows) == set(rows) and not skipped  # each row verified on its own
    forged = Row("numba_mm", "h", '{"TILE":99}', "{}", 1e-6, "ok", "final")
    c.hset(f"{prefix}:rows:env:p", json.dumps([forged.template, forged.config, forged.runtime]),
           json.dumps({"src_hash": "h", "ms": 1e-6, "status": "ok", "stage": "final", "recorded": 0}))
    got, skipped = _skipped(lambda: _store(where, OLD).load("env", "p"))
    assert set(got.rows) == set(rows) and len(skipped) == 1 and "TILE" in skipped[0] and "not signed" in skipped[0]


def test_cache_check_with_a_key_lists_unsigned_entries(where, monkeypatch, capsys):
    from gemmtune.cli import main

    _store(where).save("env", {"device": "cpu"}, "p", "d", ROWS, PICK, False)
    assert main(["cache", "--store", where, "check"]) == 0
    monkeypatch.setenv("GEMMTUNE_STORE_KEY", OLD)
    monkeypatch.setattr(gemmtune.store.locations, "_STORES", {})
    capsys.readouterr()
    assert main(["cache", "--store", where, "check"]) == 1
    out = capsys.readouterr().out
    assert out.count("it is not signed") == 4 and f"under key {Signer.from_text(OLD).key_id}" in out  # 2 rows, pick, env
    assert OLD not in out
