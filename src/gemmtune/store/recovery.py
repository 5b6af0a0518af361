"""SQLite helpers of the store: error classes, integrity checks, and copying or salvaging the rows
of a damaged file into a fresh database (used by store/sqlite.py when it opens or rebuilds a file).

Example:
    >>> import sqlite3
    >>> _busy(sqlite3.OperationalError("database is locked"))
    True
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Callable

from .marker import SCHEMA, add_columns

_UNWRITABLE = ("readonly", "read-only", "unable to open", "disk is full", "disk i/o error", "permission denied",
               "authorization denied")


def _busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _unwritable(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(s in text for s in _UNWRITABLE)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _close(db: sqlite3.Connection | None) -> None:
    if db is not None:
        try:
            db.close()
        except sqlite3.Error:
            pass


def _check_integrity(db: sqlite3.Connection) -> None:
    """Raise sqlite3.DatabaseError unless SQLite's quick check passes (it reads every page once)."""
    result = [r[0] for r in db.execute("PRAGMA quick_check(5)")]
    if result != ["ok"]:
        raise sqlite3.DatabaseError(f"integrity check failed: {'; '.join(map(str, result))[:300]}")
    db.execute("SELECT count(*) FROM timings").fetchone()


def _copy_into(mem: sqlite3.Connection, source: sqlite3.Connection | None, path: str | None) -> bool:
    """Copy a readable store into `mem` (SQLite's backup): from `source`, else read-only, else immutable."""
    candidates: list[Callable[[], sqlite3.Connection]] = []
    if source is not None:
        candidates.append(lambda: source)
    if path is not None and Path(path).exists():
        uri = Path(path).resolve().as_uri()
        candidates += [lambda: sqlite3.connect(uri + "?mode=ro", uri=True, timeout=5.0),
                       lambda: sqlite3.connect(uri + "?immutable=1", uri=True, timeout=5.0)]
    for make in candidates:
        src = None
        try:
            src = make()
            _check_integrity(src)
            src.backup(mem)
            mem.executescript(SCHEMA)
            add_columns(mem)  # a copy of a store of an earlier schema
            return True
        except sqlite3.Error:
            continue
        finally:
            if src is not None and src is not source:
                _close(src)
    return False


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in db.execute(f"PRAGMA table_info({table})")]


def _salvage(old: Path, db: sqlite3.Connection) -> int:
    """Copy every row still readable from the corrupted store `old` into `db`; returns the picks kept.

    Rows are read one at a time, so a damaged page loses only what is on it.  A
    pick whose own timing row did not survive is dropped: no partial pick remains.
    """
    try:
        src = sqlite3.connect(Path(old).resolve().as_uri() + "?immutable=1", uri=True, timeout=5.0)
    except sqlite3.Error:
        return 0
    try:
        db.execute("BEGIN IMMEDIATE")
        for table in ("envs", "timings", "picks"):
            try:  # the columns both files have (the damaged one may be of an earlier schema)
                cols = ",".join(c for c in _columns(db, table) if c in _columns(src, table))
                cur = src.execute(f"SELECT {cols} FROM {table}")
            except sqlite3.Error:
                continue
            while True:
                try:
                    row = cur.fetchone()
                except sqlite3.Error:
                    break
                if row is None:
                    break
                try:
                    db.execute(f"INSERT OR IGNORE INTO {table}({cols}) VALUES ({','.join('?' * len(row))})", row)
                except sqlite3.Error:
                    pass
        db.execute("DELETE FROM picks WHERE NOT EXISTS (SELECT 1 FROM timings t WHERE t.env=picks.env AND "
                   "t.problem=picks.problem AND t.template=picks.template AND t.config=picks.config AND "
                   "t.runtime=picks.runtime AND t.src_hash IS picks.src_hash AND t.status != 'not_benchmarked')")
        db.execute("COMMIT")
        return db.execute("SELECT count(*) FROM picks").fetchone()[0]
    except sqlite3.Error:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        return 0
    finally:
        _close(src)
