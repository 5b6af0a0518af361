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

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "not_ours"]

# A store file is recognised by this marker: SQLite's `PRAGMA application_id` (bytes 68-71 of the
# header, readable even when later pages are damaged) and a `gemmtune_meta` table with the schema version.
EXPORT_FORMAT = "gemmtune-store/1"  # the format tag of `gemmtune cache export` files
APPLICATION_ID = 0x676D7475  # "gmtu"
SCHEMA_VERSION = 1
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
CREATE TABLE IF NOT EXISTS envs(env TEXT PRIMARY KEY, info TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS timings(
  env TEXT NOT NULL, problem TEXT NOT NULL, template TEXT NOT NULL, src_hash TEXT,
  config TEXT NOT NULL, runtime TEXT NOT NULL, ms REAL, status TEXT NOT NULL, stage TEXT,
  recorded REAL NOT NULL, PRIMARY KEY(env, problem, template, config, runtime));
CREATE TABLE IF NOT EXISTS picks(
  env TEXT NOT NULL, problem TEXT NOT NULL, describe TEXT, template TEXT NOT NULL, src_hash TEXT,
  config TEXT NOT NULL, runtime TEXT NOT NULL, ms REAL, strategy TEXT, recorded REAL NOT NULL,
  PRIMARY KEY(env, problem));
CREATE TABLE IF NOT EXISTS provisional_picks(env TEXT NOT NULL, problem TEXT NOT NULL, run TEXT,
  PRIMARY KEY(env, problem));
CREATE TABLE IF NOT EXISTS kernel_files(key TEXT NOT NULL, name TEXT NOT NULL, data BLOB NOT NULL,
  recorded REAL NOT NULL, PRIMARY KEY(key, name));
"""
