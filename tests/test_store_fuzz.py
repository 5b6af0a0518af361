"""Corruption fuzz: seeded damage to a shared store's entries, on SQLite and on a real redis-server.

Each case damages one entry of a warm store (a type flipped, a value truncated, a huge, NaN or
negative value, a key deleted, a pick swapped with another problem's or pinned to a wrong kernel, a
signature forged), then a new process tunes the problem from that store.  Every case must give the
right result with no exception, and every entry the damage made malformed (or, with a key, unsigned
or badly signed) must be named in a warning.  Half the cases run with a store key.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import gemmtune
from gemmtune.cli import main
from gemmtune.core.settings import Settings
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate
from redis_server import RedisServer, server  # noqa: F401 - server: a fixture

CASES = 260  # per store kind: 520 in all
SHAPES = (8, 12, 16, 20)
KEY = "fuzz-fleet-secret-0123456789"
# Damage that leaves an entry malformed, so the reader must name it in a warning.
MALFORMING = ("flip_type", "truncate", "huge", "bad_number", "bad_mark", "forge")


def _templates() -> list:
    return [AtenTemplate("mm"), ScriptedTemplate("fz_good", n_configs=1), ScriptedTemplate("fz_bad", mode="wrong",
                                                                                          n_configs=1)]


def _settings(location: str, keyed: bool) -> Settings:
    return Settings(store=location, strategy="exhaustive", isolation="off", cpu_rep_ms=1.0, min_reps=1,
                    finalist_rounds=1, finalists=2, store_shared="on", store_key=KEY if keyed else None)


def _mats(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(m)
    return torch.randn(m, 16, generator=g), torch.randn(16, 8, generator=g)


def _new_process(monkeypatch) -> None:
    for store in list(gemmtune.store.locations._STORES.values()):
        close = getattr(store, "close", None)
        if close is not None:
            close()
    monkeypatch.setattr(gemmtune.store.locations, "_STORES", {})
    gemmtune.clear_dispatch_cache()


def _tune(location: str, keyed: bool, m: int):
    a, b = _mats(m)
    sel = gemmtune.tune("mm", a, b, templates=_templates(), settings=_settings(location, keyed))
    return sel, a, b


# -- the damage, on the raw storage of each kind -------------------------------------------------------

CHECKED = ("ms", "template", "status", "config", "runtime")  # fields every reader must check


def _flip(field: str, rng: random.Random) -> Any:
    """A value of a type the field never holds."""
    return rng.choice(["fast", [1], {"x": 1}, True] if field == "ms" else [7, [1, 2], {"x": 1}, True, None])


def _damage_json(text: str, kind: str, rng: random.Random) -> str:
    """`text` (a JSON object's text) damaged by `kind`."""
    if kind == "truncate":
        return text[: rng.randrange(0, max(1, len(text) - 1))]
    data = json.loads(text)
    field = rng.choice([f for f in CHECKED if f in data])
    if kind == "flip_type":
        data[field] = _flip(field, rng)
    elif kind == "huge":
        data[field] = "x" * 300_000
    elif kind == "bad_number":
        data["ms"] = rng.choice([float("nan"), -1.0, float("inf"), -1e-9, 1e309])
        return json.dumps(data)  # NaN and Infinity as Python writes them
    elif kind == "forge":
        data["ms"] = 1e-9  # a value changed under the signature it had
    return json.dumps(data)


@dataclass
class SqliteKind:
    path: Path

    def location(self) -> str:
        return str(self.path)

    def snapshot(self) -> Callable[[], None]:
        saved = self.path.with_suffix(".snap")
        db = sqlite3.connect(self.path)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()
        shutil.copy(self.path, saved)

        def restore() -> None:
            for suffix in ("-wal", "-shm"):
                Path(str(self.path) + suffix).unlink(missing_ok=True)
            shutil.copy(saved, self.path)

        return restore

    def damage(self, kind: str, problem: str, other: str, rng: random.Random) -> None:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            self._damage(db, kind, problem, other, rng)
        finally:
            db.close()

    def _damage(self, db: sqlite3.Connection, kind: str, problem: str, other: str, rng: random.Random) -> None:
        table = rng.choice(["timings", "picks"])
        cols = {"timings": ["template", "src_hash", "config", "runtime", "ms", "status", "stage"],
                "picks": ["template", "src_hash", "config", "runtime", "ms", "strategy"]}[table]
        where = "problem=?" + (" AND rowid=(SELECT rowid FROM timings WHERE problem=? ORDER BY random() LIMIT 1)"
                               if table == "timings" else "")
        args: tuple = (problem, problem) if table == "timings" else (problem,)
        col = rng.choice([c for c in cols if c in CHECKED])
        if kind == "flip_type":  # a value no reader may take (a text column turns numbers into text)
            value = rng.choice({"ms": ["fast", b"\x00\xff", "[1]"], "template": [b"\x00\xff"]}.get(
                col, [b"\x00\xff", 12345, 1.5]))
            db.execute(f"UPDATE {table} SET {col}=? WHERE {where}", (value, *args))
        elif kind == "truncate":
            col = rng.choice(["config", "runtime"])
            db.execute(f"UPDATE {table} SET {col}=substr({col}, 1, 1) WHERE {where}", args)
        elif kind == "huge":
            db.execute(f"UPDATE {table} SET {col}=? WHERE {where}", ("x" * 300_000, *args))
        elif kind == "bad_number":
            db.execute(f"UPDATE {table} SET ms=? WHERE {where}", (rng.choice([-1.0, "NaN", "inf", -5e-3]), *args))
        elif kind == "bad_mark":
            db.execute("INSERT OR REPLACE INTO provisional_picks(env, problem, run) SELECT env, problem, ? FROM picks "
                       "WHERE problem=?", (rng.choice(["x@notatime", "@", "a" * 300_000, "1@nan"]), problem))
        elif kind == "forge":
            db.execute(f"UPDATE {table} SET ms=1e-9 WHERE {where}", args)
        elif kind == "delete":
            db.execute(f"DELETE FROM {table} WHERE {where}", args)
        elif kind == "swap":
            db.execute("UPDATE picks SET (template, src_hash, config, runtime, ms) = (SELECT template, src_hash, config, "
                       "runtime, ms FROM picks WHERE problem=?) WHERE problem=?", (other, problem))
        elif kind == "poison":
            bad = "(SELECT template, src_hash, config, runtime FROM timings WHERE problem=? AND template='fz_bad')"
            db.execute(f"UPDATE picks SET (template, src_hash, config, runtime) = {bad}, ms=1e-9 WHERE problem=?",
                       (problem, problem))
            db.execute("UPDATE timings SET status='ok', ms=1e-9 WHERE problem=? AND template='fz_bad'", (problem,))


@dataclass
class RedisKind:
    server: RedisServer
    prefix: str

    def location(self) -> str:
        return self.server.url(prefix=self.prefix)

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.server.port, decode_responses=False)

    def snapshot(self) -> Callable[[], None]:
        client = self.client()
        keys = list(client.scan_iter(match=f"{self.prefix}:*".encode()))
        dumps = {k: client.dump(k) for k in keys}

        def restore() -> None:
            for k in client.scan_iter(match=f"{self.prefix}:*".encode()):
                client.delete(k)
            for k, v in dumps.items():
                client.restore(k, 0, v, replace=True)

        return restore

    def _key(self, client: Any, kind: str, problem: str) -> bytes:
        [key] = [k for k in client.scan_iter(match=f"{self.prefix}:{kind}:*".encode()) if k.decode().endswith(problem)]
        return key

    @staticmethod
    def _fields(client: Any, rows_key: bytes) -> list[bytes]:
        """The rows' fields (each a choice, a JSON list), not the hash's own entries."""
        return sorted(f for f in client.hkeys(rows_key) if f.startswith(b"["))

    def damage(self, kind: str, problem: str, other: str, rng: random.Random) -> None:
        client = self.client()
        pick_key, rows_key = self._key(client, "pick", problem), self._key(client, "rows", problem)
        if kind == "bad_mark":
            client.set(pick_key.replace(b":pick:", b":prov:"), rng.choice(["x@notatime", "@", "a" * 300_000, "1@nan"]))
        elif kind == "delete":
            target = rng.choice(["pick", "row", "index", "env"])
            if target == "pick":
                client.delete(pick_key)
            elif target == "row":
                client.hdel(rows_key, rng.choice(self._fields(client, rows_key)))
            elif target == "index":
                client.delete(f"{self.prefix}:index")
            else:
                for k in client.scan_iter(match=f"{self.prefix}:env:*".encode()):
                    client.delete(k)
        elif kind == "swap":
            client.set(pick_key, client.get(self._key(client, "pick", other)))
        elif kind == "poison":
            fields = {f: json.loads(client.hget(rows_key, f)) for f in self._fields(client, rows_key)}
            bad = rng.choice([f for f in fields if json.loads(f)[0] == "fz_bad"])
            template, config, runtime = json.loads(bad)
            pick = json.loads(client.get(pick_key))
            pick.update(template=template, src_hash=fields[bad]["src_hash"], config=config, runtime=runtime, ms=1e-9)
            client.set(pick_key, json.dumps(pick))
            client.hset(rows_key, bad, json.dumps({**fields[bad], "status": "ok", "ms": 1e-9}))
        elif rng.random() < 0.5:
            client.set(pick_key, _damage_json(client.get(pick_key).decode(), kind, rng))
        else:
            field = rng.choice(self._fields(client, rows_key))
            if kind in ("truncate", "flip_type") and rng.random() < 0.3:  # the field (the choice) itself
                client.hset(rows_key, field + b"]" if kind == "truncate" else b'{"x": 1}', client.hget(rows_key, field))
                client.hdel(rows_key, field)
            else:
                client.hset(rows_key, field, _damage_json(client.hget(rows_key, field).decode(), kind, rng))


def _kinds(rng: random.Random, keyed: bool) -> str:
    kinds = ["flip_type", "truncate", "huge", "bad_number", "bad_mark", "delete", "swap", "poison"]
    return rng.choice(kinds + (["forge", "forge"] if keyed else []))


def _problem_keys(location: str, keyed: bool) -> dict[int, str]:
    out = {}
    for m in SHAPES:
        sel, a, b = _tune(location, keyed, m)
        torch.testing.assert_close(sel(a, b), a @ b)
        assert sel.winner.template_uid != "fz_bad"
        out[m] = sel.problem.problem_key
    return out


def _warm(kind: str, tmp_path: Path, request, monkeypatch, keyed: bool) -> tuple[Any, dict[int, str], Callable]:
    """A store of `kind` holding a pick and timings for every shape, and the function that restores it."""
    store: Any = (SqliteKind(tmp_path / f"fleet-{keyed}.sqlite") if kind == "sqlite"
                  else RedisKind(request.getfixturevalue("server"), f"fz{uuid.uuid4().hex[:10]}"))
    _new_process(monkeypatch)
    problems = {}
    for m in SHAPES:
        sel, a, b = _tune(store.location(), keyed, m)
        torch.testing.assert_close(sel(a, b), a @ b)
        assert sel.winner.template_uid != "fz_bad"
        problems[m] = f"{sel.problem.problem_key}|out=row"  # as the store keys it
    _new_process(monkeypatch)
    return store, problems, store.snapshot()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_damaged_store_never_crashes_a_reader_nor_gives_a_wrong_result(kind, tmp_path, monkeypatch, request):
    rng = random.Random(f"store-fuzz-{kind}")
    warm = {keyed: _warm(kind, tmp_path, request, monkeypatch, keyed) for keyed in (False, True)}
    unnamed, results = [], 0
    for case in range(CASES):
        keyed = case % 2 == 1
        store, problems, restore = warm[keyed]
        m, other = rng.sample(SHAPES, 2)
        damage = _kinds(rng, keyed)
        store.damage(damage, problems[m], problems[other], rng)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            sel, a, b = _tune(store.location(), keyed, m)
            torch.testing.assert_close(sel(a, b), a @ b, msg=f"case {case}: {damage} gave a wrong result")
            if case % 13 == 0:  # the management commands read every entry too
                assert main(["cache", "--store", store.location(), "ls"]) in (0, 1)
        results += 1
        texts = " | ".join(str(w.message) for w in seen)
        malformed = damage in MALFORMING or (keyed and damage in ("swap", "poison"))
        if malformed and problems[m].split("|")[0] not in texts:
            unnamed.append((case, damage, texts[:300]))
        _new_process(monkeypatch)
        restore()
    assert results == CASES
    assert not unnamed, f"{len(unnamed)} bad entries not named in a warning, e.g. {unnamed[:3]}"
