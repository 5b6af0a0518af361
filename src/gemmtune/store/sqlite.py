"""The persistent store of timings and picks (SQLite by default).

One row per (environment, problem, template, config, runtime params): its
time or failure, and the template's `src_hash` when it was measured.  A row
whose `src_hash` differs from the template's current one is stale: it is
ignored, reported, and replaced when the choice is measured again.

Concurrent processes are safe: WAL journal, a busy timeout and retries (a store another process
keeps locked for more than `Settings.store_lock_timeout_s` in all falls back to memory, with one
warning); the first writer of a row or a pick wins, so every process returns the same pick.  A file
another user owns or may write is shared (`trust.others_may_write`): what it answers is checked
before it runs.
A problem's rows and its pick are one transaction, so a process killed
mid-write leaves all of them or none.  A file that is not a gemmtune store
(`marker.not_ours`: no application_id of ours, and not an unmarked store with
exactly our tables) is never written or moved: it is refused with a warning and
the store lives in memory.  A corrupted store of ours (found when opening,
by SQLite's quick check, or by a later read or write) is moved aside and
rebuilt with every row still readable from it; an unwritable location falls
back to an in-memory store that starts from a copy of the file's picks.  Both
warn; neither raises.  docs/RELIABILITY.md lists the cases and their tests.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from .keys import Row, Stored, canon, env_info, env_key
from . import sqlite_entries
from .entry import Entries
from .marker import APPLICATION_ID, SCHEMA, SCHEMA_VERSION, add_columns, missing_columns, not_ours as _not_ours
from .recovery import _busy, _check_integrity, _close, _copy_into, _inode, _salvage, _unwritable
from .presence import Presence
from .trust import Trust, others_may_write
from .views import StoreViews

__all__ = ["Row", "Store", "Stored", "canon", "env_info", "env_key", "default_cache_dir"]

log = logging.getLogger("gemmtune")

def default_cache_dir() -> Path:
    """The store's directory: `settings.cache_dir()`."""
    from ..core.settings import cache_dir

    return cache_dir()


class Store(StoreViews):
    """SQLite store.  `Store(":memory:")` keeps everything in this process only.

    Example:
        >>> s = Store(":memory:")
        >>> s.load("env", "problem").pick is None
        True
    """

    def __init__(self, path: str | Path = ":memory:", retries: int = 20, trust: Trust | None = None):
        self.trust = trust if trust is not None else Trust()
        self.path = str(path)
        # Shared (what it answers is checked before it runs, `store.checked`): "on", or a file another
        # user owns or may write; a file only this user can write is trusted as the user's own cache.
        foreign = others_may_write(self.path) if self.path != ":memory:" else None
        self.shared = self.trust.shared == "on" or foreign is not None
        self.retries = retries  # kept for callers; waits are bounded by `trust.lock_timeout_s` in all
        self.origin = self.path  # the location asked for (`path` becomes ":memory:" after a fall-back)
        self.warnings: list[str] = []
        self.entries = Entries(self)  # entries read through the schema (store.entry); the bad ones counted
        self.bad_entries = self.entries.bad
        self._inode: int | None = None
        self._use = threading.RLock()  # `_guarded`: one thread at a time on the connection
        self._db = self._open()
        # Which processes hold the file (`store.presence`): a pick others may run is replaced only alone.
        self.presence = (Presence.join(self.path, self.trust.lock_timeout_s, owner=self)
                         if self.path != ":memory:" else None)

    # -- opening, with the fall-backs ---------------------------------------------------
    #
    # Three kinds of trouble, told apart by SQLite's error:
    # - busy / locked: another process writes; waited for `trust.lock_timeout_s` in all (busy timeout
    #   and retries), then the store falls back to memory as below, with one warning naming it;
    # - unwritable (read-only file or directory, no space, I/O error, cannot open): the store's
    #   contents are copied into memory when they can be read, so earlier picks are still served;
    #   new picks live in this process only.  Warns.
    # - anything else (not a database, malformed pages, a failed integrity check): corrupted.  The
    #   file (and its -wal, -shm) is moved aside to `<name>.corrupt-<time>-<pid>`, a new store is
    #   started, and every row still readable from the old file is copied into it (picks whose
    #   timing row was lost are dropped, so no partial pick remains).  Warns.
    def _open(self, _depth: int = 0) -> sqlite3.Connection:
        if self.path == ":memory:":
            return self._connect(":memory:")
        path = Path(self.path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return self._fallback(f"store directory {path.parent} is not usable ({exc})")
        db = None
        try:
            foreign = _not_ours(path)
            if foreign:
                return self._refuse(path, foreign)
            self._inode = _inode(path)
            db = self._connect(str(path))
            self._schema(db)  # the marker first: a file killed while opening is empty or marked
            db.execute("PRAGMA journal_mode=WAL")
            _check_integrity(db)
            if self._inode is None:
                self._inode = _inode(path)
            return db
        except sqlite3.DatabaseError as exc:
            if _busy(exc):  # another process holds the lock past `lock_timeout_s`: never a corruption
                return self._fallback(self._locked(), source=db)
            if _unwritable(exc) or not os.access(path.parent, os.W_OK):
                return self._fallback(f"store {path} is not writable ({exc})", source=db)
            _close(db)
            return self._rebuild(path, exc, _depth)
        except OSError as exc:
            _close(db)
            return self._fallback(f"store {path} is not usable ({exc})")

    def _rebuild(self, path: Path, exc: BaseException, depth: int) -> sqlite3.Connection:
        """Move a corrupted file aside, start a new store there and copy in what is still readable."""
        if depth < 2 and self._inode is not None and _inode(path) not in (self._inode, None):
            return self._open(depth + 1)  # another process already replaced the corrupted file
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}-{os.getpid()}")
        try:
            for suffix in ("", "-wal", "-shm"):
                if Path(str(path) + suffix).exists():
                    os.replace(str(path) + suffix, str(aside) + suffix)
            db = self._connect(str(path))
            self._schema(db)
            db.execute("PRAGMA journal_mode=WAL")
            self._inode = _inode(path)
        except (OSError, sqlite3.DatabaseError) as exc2:
            return self._fallback(f"store {path} is corrupted ({exc}) and could not be replaced ({exc2})")
        kept = _salvage(aside, db)
        self._warn(f"store {path} was corrupted ({exc}); moved it to {aside}, started a new one "
                   f"and kept the {kept} picks still readable")
        return db

    def _refuse(self, path: Path, why: str) -> sqlite3.Connection:
        """A file that is not a gemmtune store: never opened for writing, never moved; tune in memory."""
        self._warn(f"{path} is not a gemmtune store ({why}); left it untouched and keeping picks in memory "
                   "for this process only (give --store another path)")
        self.path = ":memory:"
        return self._connect(":memory:")

    def _fallback(self, why: str, source: sqlite3.Connection | None = None) -> sqlite3.Connection:
        """An in-memory store for this process, holding a copy of the unwritable store when it can be read."""
        mem = self._connect(":memory:")
        path = self.path if self.path != ":memory:" else None
        copied = _copy_into(mem, source, path)
        _close(source)
        if not copied and path is not None and Path(path).exists():
            copied = _salvage(Path(path), mem) > 0  # unreadable as a whole (corrupted): row by row
        kept = mem.execute("SELECT count(*) FROM picks").fetchone()[0] if copied else 0
        self._warn(f"{why}; keeping picks in memory for this process only"
                   + (f" (starting from a copy of its {kept} picks)" if copied else ""))
        self.path = ":memory:"
        return mem

    def _recover(self, exc: sqlite3.DatabaseError) -> None:
        """A read or write failed after opening: fall back (unwritable) or rebuild (corrupted)."""
        if self.path == ":memory:":
            raise exc
        if _unwritable(exc):
            self._db = self._fallback(f"store {self.path} is not writable ({exc})", source=self._db)
        else:
            _close(self._db)
            self._db = self._rebuild(Path(self.path), exc, 0)

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` against the store; on corruption or an unwritable store, recover once and run it again.
        One thread at a time: compile threads read kernels from the store while the tuning thread writes,
        and SQLite refuses a connection used by two threads at once ("bad parameter or other API misuse")."""
        with self._use:  # one connection: its statements and transactions never interleave across threads
            try:
                return fn()
            except sqlite3.DatabaseError as exc:
                if _busy(exc) and self.path != ":memory:":  # waited `lock_timeout_s` already: memory
                    self._db = self._fallback(self._locked(), source=self._db)
                elif _busy(exc):
                    raise
                else:
                    self._recover(exc)
                return fn()

    def _locked(self) -> str:
        return f"store {self.path} is locked by another process for more than {self.trust.lock_timeout_s:g} s"

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        warnings.warn(f"gemmtune: {message}", RuntimeWarning, stacklevel=4)

    def _connect(self, target: str) -> sqlite3.Connection:
        wait = max(self.trust.lock_timeout_s, 0.0)  # a lock another process holds: waited on this long
        db = sqlite3.connect(target, timeout=wait, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA busy_timeout={int(wait * 1000)}")
        if target == ":memory:":
            self._schema(db)
        return db

    @staticmethod
    def _schema(db: sqlite3.Connection) -> None:
        """Create the tables and the marker (one transaction: a new file is complete or still empty)."""
        if db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID:
            db.executescript(SCHEMA)  # ours already (tables added by a later schema are created here)
        else:
            db.executescript(f"BEGIN IMMEDIATE; {SCHEMA} PRAGMA application_id={APPLICATION_ID}; "
                             "CREATE TABLE IF NOT EXISTS gemmtune_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL); "
                             f"INSERT OR REPLACE INTO gemmtune_meta VALUES ('schema_version', '{SCHEMA_VERSION}'); "
                             "COMMIT;")
        if missing_columns(db):  # a store of an earlier schema: its new columns, in one transaction
            db.execute("BEGIN IMMEDIATE")
            try:
                add_columns(db)
                db.execute("COMMIT")
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the failure ended the transaction already
                raise

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, retried while another process holds the lock, for
        `trust.lock_timeout_s` in all (the busy timeout and the retries); then SQLite's busy error."""
        deadline = time.monotonic() + max(self.trust.lock_timeout_s, 0.0)
        for attempt in range(1 << 30):
            try:
                self._db.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:
                left = deadline - time.monotonic()
                if not _busy(exc) or left <= 0:
                    raise
                time.sleep(min(0.05 * 2 ** attempt, 1.0, left))
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the transaction is already gone (e.g. a corrupted page aborted it)
            raise

    # -- reading and writing ------------------------------------------------------------
    def load(self, env: str, problem: str) -> Stored:
        """The stored rows and pick of one problem (never raises for a corrupted or unwritable store)."""
        return self._guarded(lambda: self._load(env, problem))

    def _load(self, env: str, problem: str) -> Stored:
        """One read transaction: the rows, pick and mark come from one snapshot of the file, so a pick
        another process saves meanwhile is read with its rows or not at all (never a pick without them)."""
        db = self._db
        db.execute("BEGIN")
        try:
            stored = sqlite_entries.load(db, self.entries, env, problem)
            db.execute("COMMIT")
        except BaseException:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # a failed read may have ended the transaction already
            raise
        return stored

    def save(self, env: str, info: dict[str, Any], problem: str, describe: str, rows: list[Row],
             pick: Row, replace_pick: bool | Row, provisional: str | None = None) -> Row:
        """Record `rows` (same-hash rows already there win) and the pick; returns the stored pick.
        `replace_pick`: False keeps a pick already there; True writes over it; a Row writes over it only
        while it is still that pick (what the caller read: racing re-tunes agree on the first).

        Rows and pick are written in one transaction: a process killed mid-write
        leaves either all of them or none.  A `provisional` pick (decided under heavy noise) is
        marked with that run's id; a pick written over it unmarks it unless it is provisional too.

        Example:
            >>> s, pick = Store(":memory:"), Row("aten_mm", None, "{}", "{}", 1.0, "ok")
            >>> _ = s.save("env", {}, "p", "p", [pick], pick, replace_pick=False, provisional="run-1")
            >>> s.load("env", "p").provisional
            'run-1'
        """
        return self._guarded(lambda: self._save(env, info, problem, describe, rows, pick, replace_pick, provisional))

    def _save(self, env: str, info: dict[str, Any], problem: str, describe: str, rows: list[Row],
              pick: Row, replace_pick: bool | Row, provisional: str | None = None) -> Row:
        with self._tx() as db:
            sqlite_entries.save(db, self.entries, env, info, problem, describe, rows, pick, replace_pick,
                                provisional, time.time())
        return sqlite_entries.read_pick(self._db, self.entries, env, problem)[0] or pick

    def forget(self, env: str, problem: str, row: Row) -> None:
        """Drop a problem's pick and the timing row of the choice it names (a pick found wrong)."""
        def run() -> None:
            with self._tx() as db:
                for table in ("picks", "provisional_picks"):
                    db.execute(f"DELETE FROM {table} WHERE env=? AND problem=?", (env, problem))
                db.execute("DELETE FROM timings WHERE env=? AND problem=? AND template=? AND config=? AND runtime=?",
                           (env, problem, *row.choice_key))
        self._guarded(run)

    # -- management (the `gemmtune cache` commands) -------------------------------------
    def problems(self) -> list[dict[str, Any]]:
        return self._guarded(self._problems)

    def _problems(self) -> list[dict[str, Any]]:
        return sqlite_entries.problems(self._db, self.entries)

    def check(self) -> tuple[int, list[tuple[str, str]]]:
        """Every entry read through the schema (`gemmtune cache check`): (how many were read, the bad
        ones as (key, why))."""
        checker = Entries(self, keep=None)
        checker.quiet = True
        return self._guarded(lambda: sqlite_entries.check(self._db, checker)), checker.bad

    # -- compiled kernels (`store.kernels`, `share_kernels`) ------------------------------
    def kernel_files(self, key: str) -> dict[str, bytes]:
        """The files kept under a compiler cache's `key` (name -> contents; also the in-model verdicts,
        `dispatch.verdicts`), within the bounds and, with a key, signed (`store.kernel_entries`); {} when none."""
        from . import sqlite_kernels
        from .kernel_entries import verified

        entries, _ = self._guarded(lambda: sqlite_kernels.read(self._db, key, self.path))
        return verified(self.trust.signer, key, entries, self.path)

    def has_kernel_files(self, key: str) -> bool:
        """Whether anything is kept under `key`; with a key, whether every file there verifies (else a
        writer with the key writes it again: `put_kernel_files`)."""
        from . import sqlite_kernels
        from .kernel_entries import whole

        if self.trust.signer is not None:
            return whole(self.trust.signer, key, *self._guarded(lambda: sqlite_kernels.read(self._db, key, self.path)))
        return self._guarded(lambda: self._db.execute("SELECT 1 FROM kernel_files WHERE key=? LIMIT 1",
                                                      (key,)).fetchone() is not None)

    def put_kernel_files(self, key: str, files: dict[str, bytes]) -> None:
        """Keep `files` under `key`, signed where the store has a key; a file already kept there stays
        as it is (the first writer wins), unless it does not verify under the key."""
        from . import sqlite_kernels

        def run() -> None:
            with self._tx() as db:
                sqlite_kernels.write(db, key, files, self.trust.signer, self.path)

        self._guarded(run)

    def clear(self) -> int:
        return self._guarded(self._clear)

    def _clear(self) -> int:
        with self._tx() as db:
            n = db.execute("SELECT count(*) FROM picks").fetchone()[0]
            db.execute("DELETE FROM timings")
            db.execute("DELETE FROM picks")
            db.execute("DELETE FROM provisional_picks")
            db.execute("DELETE FROM envs")
            db.execute("DELETE FROM kernel_files")
        return n

    def close(self) -> None:
        with self._use:
            self._db.close()

