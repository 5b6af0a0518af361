"""A store file that is not gemmtune's is never written, moved or rebuilt; lookup/import inputs are never written."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gemmtune.store.marker import APPLICATION_ID, SCHEMA_VERSION
from gemmtune.store.sqlite import SCHEMA, Row, Store

ROWS = [Row("tmpl", "h", json.dumps({"c": 1}, separators=(",", ":")), "{}", 1.0, "ok", "final")]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _app_db(path: Path, tables: str) -> None:
    db = sqlite3.connect(path)
    db.executescript(tables)
    db.commit()
    db.close()


FOREIGN = {
    "other_app_timings": lambda p: _app_db(p, "CREATE TABLE timings(user TEXT, seconds REAL);"
                                              "INSERT INTO timings VALUES ('ann', 3.5);"),
    "unrelated_tables": lambda p: _app_db(p, "CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT);"
                                             "INSERT INTO users VALUES (1, 'ann');"),
    "other_application_id": lambda p: _app_db(p, "PRAGMA application_id=1234; CREATE TABLE envs(x);"
                                                 "CREATE TABLE timings(x); CREATE TABLE picks(x);"),
    "text_file": lambda p: p.write_text("not a database\n" * 100),
    "garbage_header": lambda p: p.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 20),
    "truncated_header": lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 30),
}


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_a_file_that_is_not_ours_is_refused_left_byte_identical_and_tuning_goes_on_in_memory(tmp_path, kind):
    path = tmp_path / "app.db"
    FOREIGN[kind](path)
    before = digest(path)
    with pytest.warns(RuntimeWarning, match="is not a gemmtune store") as caught:
        store = Store(path)
    assert len(caught) == 1 and "left it untouched" in str(caught[0].message)
    assert store.path == ":memory:"
    store.save("env", {"d": 1}, "p", "d", ROWS, ROWS[0], replace_pick=False)
    assert store.load("env", "p").pick.config == ROWS[0].config
    store.close()
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # nothing moved aside, no -wal/-shm


def test_a_new_store_carries_the_marker_and_schema_version(tmp_path):
    path = tmp_path / "s.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert db.execute("SELECT value FROM gemmtune_meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


@pytest.mark.parametrize("provisional", [False, True])  # both table sets stores had before the marker
def test_an_unmarked_store_with_exactly_our_tables_is_adopted_with_its_picks(tmp_path, recwarn, provisional):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA.replace(", sig TEXT", ""))  # the tables of then: no signatures
    db.execute("DROP TABLE kernel_files")  # came long after the marker (share_kernels)
    if not provisional:
        db.execute("DROP TABLE provisional_picks")
    db.execute("INSERT INTO timings VALUES ('env','p','tmpl','h',?, '{}', 1.0, 'ok', 'final', 0)", (ROWS[0].config,))
    db.execute("INSERT INTO picks VALUES ('env','p','d','tmpl','h',?, '{}', 1.0, 'final', 0)", (ROWS[0].config,))
    db.commit()
    db.close()
    store = Store(path)
    assert store.path == str(path) and not store.warnings
    assert store.load("env", "p").pick.config == ROWS[0].config
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


def test_cli_tune_with_a_foreign_store_leaves_it_identical(tmp_path):
    path = tmp_path / "app.db"
    FOREIGN["other_app_timings"](path)
    before = digest(path)
    proc = subprocess.run([sys.executable, "-m", "gemmtune.cli", "tune", "--shape", "8x8x8", "--device", "cpu",
                           "--backends", "extern", "--store", str(path), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "is not a gemmtune store" in proc.stderr
    assert digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]
