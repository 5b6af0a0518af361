"""How a gemmtune store file is recognised, so that a file that is not ours is never written or moved.

A store carries SQLite's `PRAGMA application_id` = `APPLICATION_ID` (bytes 68-71 of the file's
header, readable even when later pages are damaged) and a `gemmtune_meta` table holding the
schema version.  `not_ours(path)` reads only the header (and, for an unmarked SQLite file, its
table names, read-only) and says why a file is not a gemmtune store.

Example:
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "notes.txt"
    >>> _ = p.write_text("hello" * 40)
    >>> not_ours(p)
    'not a SQLite database'
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "add_columns", "missing_columns", "not_ours"]

# A store file is recognised by this marker: SQLite's `PRAGMA application_id` (bytes 68-71 of the
# header, readable even when later pages are damaged) and a `gemmtune_meta` table with the schema version.
EXPORT_FORMAT = "gemmtune-store/1"  # the format tag of `gemmtune cache export` files
APPLICATION_ID = 0x676D7475  # "gmtu"
SCHEMA_VERSION = 2  # 2: a `sig` column (signed entries, store/signing.py) on every table but kernel_files
# A store from before the marker has exactly these tables, with or without provisional_picks (it came
# a little before the marker did).
_OUR_TABLES = (frozenset({"envs", "timings", "picks"}), frozenset({"envs", "timings", "picks", "provisional_picks"}))


def not_ours(path: Path) -> str | None:
    """Why the file at `path` is not a gemmtune store, or None when it is ours (or new, or empty).

    Ours: SQLite's header carries our application_id.  A store from before the marker (application_id 0
    and exactly gemmtune's tables, or no table at all) is ours too: opening it adopts it (marks it).
    Anything else (another app's database, a file that is not SQLite or whose header is unreadable)
    is not: it is left alone.  Raises OSError when the file cannot be read.
    """
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except FileNotFoundError:
        return None
    if not header:
        return None  # 0 bytes: what a crash right after creating the file leaves; SQLite starts it afresh
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        return "not a SQLite database"
    app_id = int.from_bytes(header[68:72], "big")
    if app_id == APPLICATION_ID:
        return None
    if app_id != 0:
        return f"a SQLite database of another application (application_id {app_id:#x})"
    tables = _tables(path)
    if tables is None:
        return "an unmarked SQLite database whose tables cannot be read"
    if tables and tables not in _OUR_TABLES:  # no table: nothing to lose (an older gemmtune killed while opening)
        shown = ", ".join(sorted(tables)[:5]) or "none"
        return f"a SQLite database without gemmtune's marker, with tables: {shown}"
    return None


def _tables(path: Path) -> frozenset[str] | None:
    """The user tables of a SQLite file, read without writing to it; None when unreadable."""
    uri = Path(path).resolve().as_uri()
    for mode in ("?mode=ro", "?immutable=1"):
        db = None
        try:
            db = sqlite3.connect(uri + mode, uri=True, timeout=5.0)
            names = db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
            return frozenset(n for (n,) in names if not n.startswith("sqlite_"))
        except sqlite3.Error:
            continue
        finally:
            if db is not None:
                db.close()
    return None


# The store's tables (sqlite.py creates them; recovery.py rebuilds a damaged file with them).
SCHEMA = """
CREATE TABLE IF NOT EXISTS envs(env TEXT PRIMARY KEY, info TEXT NOT NULL, sig TEXT);
CREATE TABLE IF NOT EXISTS timings(
  env TEXT NOT NULL, problem TEXT NOT NULL, template TEXT NOT NULL, src_hash TEXT,
  config TEXT NOT NULL, runtime TEXT NOT NULL, ms REAL, status TEXT NOT NULL, stage TEXT,
  recorded REAL NOT NULL, sig TEXT, PRIMARY KEY(env, problem, template, config, runtime));
CREATE TABLE IF NOT EXISTS picks(
  env TEXT NOT NULL, problem TEXT NOT NULL, describe TEXT, template TEXT NOT NULL, src_hash TEXT,
  config TEXT NOT NULL, runtime TEXT NOT NULL, ms REAL, strategy TEXT, recorded REAL NOT NULL, sig TEXT,
  PRIMARY KEY(env, problem));
CREATE TABLE IF NOT EXISTS provisional_picks(env TEXT NOT NULL, problem TEXT NOT NULL, run TEXT, sig TEXT,
  PRIMARY KEY(env, problem));
CREATE TABLE IF NOT EXISTS kernel_files(key TEXT NOT NULL, name TEXT NOT NULL, data BLOB NOT NULL,
  recorded REAL NOT NULL, PRIMARY KEY(key, name));
"""
# Columns a later schema added to a table of an earlier one (`add_columns` adds them when a store opens).
ADDED_COLUMNS = (("envs", "sig"), ("timings", "sig"), ("picks", "sig"), ("provisional_picks", "sig"))


def missing_columns(db: sqlite3.Connection) -> list[tuple[str, str]]:
    """The (table, column) pairs of `ADDED_COLUMNS` that `db`'s tables lack (a store of an earlier schema).

    Example:
        >>> db = sqlite3.connect(":memory:"); _ = db.executescript(SCHEMA)
        >>> missing_columns(db)
        []
    """
    have: dict[str, set[str]] = {}
    for table, _ in ADDED_COLUMNS:
        if table not in have:
            have[table] = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
    return [(t, c) for t, c in ADDED_COLUMNS if have[t] and c not in have[t]]


def add_columns(db: sqlite3.Connection) -> None:
    """Bring a store of an earlier schema up to this one (ALTER TABLE ADD COLUMN: nullable columns, so
    every row already there stays as it is).  Call it inside a write transaction (another process may
    add them at the same moment); records `SCHEMA_VERSION` in the marker table when it has one."""
    for table, column in missing_columns(db):
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
    if db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='gemmtune_meta'").fetchone():
        db.execute("INSERT OR REPLACE INTO gemmtune_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
