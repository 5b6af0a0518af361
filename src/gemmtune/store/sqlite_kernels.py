"""A SQLite store's kernel files (`Store.kernel_files`): the `kernel_files` table, one row per file,
signed and bounded as `store.kernel_entries` says.  Sizes are read first (`length(data)`, which SQLite
answers without loading a blob), and only what is within the bounds is loaded.

Example:
    >>> import sqlite3
    >>> from gemmtune.store.marker import SCHEMA
    >>> db = sqlite3.connect(":memory:"); db.executescript(SCHEMA) and None
    >>> write(db, "K", {"k.cubin": b"binary"}, None, ":memory:"); read(db, "K", ":memory:")
    ({'k.cubin': b'binary'}, True)
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from . import kernel_entries as bounds
from .kernel_entries import SIG, signed, skip, verified, within_bounds

__all__ = ["read", "write"]


def read(db: sqlite3.Connection, key: str, where: str) -> tuple[dict[str, bytes], bool]:
    """(the entries under `key` within the bounds, whether none was left out)."""
    sizes = db.execute("SELECT CASE WHEN typeof(name) = 'text' AND length(name) <= ? THEN name END, "
                       "CASE WHEN typeof(data) = 'blob' THEN length(data) END FROM kernel_files WHERE key=? LIMIT ?",
                       (bounds.MAX_NAME_CHARS, key, bounds.MAX_ENTRIES + 1)).fetchall()
    names, complete = within_bounds(sizes, where, key)
    if not names:
        return {}, complete
    wanted, entries, total = set(names), {}, 0
    rows = db.execute("SELECT name, CASE WHEN typeof(data) = 'blob' AND length(data) <= ? THEN data END "
                      "FROM kernel_files WHERE key=? LIMIT ?", (bounds.MAX_FILE_BYTES, key, bounds.MAX_ENTRIES))
    for name, data in rows:  # one file at a time: rewritten by another process meanwhile, still bounded
        if name in wanted and data is not None:
            entries[name] = bytes(data)
            total += len(data)
            if total > bounds.MAX_KERNEL_BYTES:
                skip(where, key, "oversized", f"its entries weigh more than {bounds.MAX_KERNEL_BYTES} bytes together")
                return {}, False
    return entries, complete and len(entries) == len(names)


def write(db: sqlite3.Connection, key: str, files: dict[str, bytes], signer: Any, where: str) -> None:
    """Keep `files` under `key` (in the caller's transaction).  Without a signer a file already there
    stays (the first writer wins); with one, the files there that verify stay, and every other entry
    under `key` is replaced or removed (an unsigned or planted entry never blocks a signed one)."""
    now = time.time()
    if signer is None:
        db.executemany("INSERT OR IGNORE INTO kernel_files VALUES (?, ?, ?, ?)",
                       [(key, name, data, now) for name, data in files.items()])
        return
    entries, complete = read(db, key, where)
    kept = verified(signer, key, entries, where, quiet=True)
    fresh = {name: data for name, data in files.items() if name not in kept}
    if complete and len(entries) == 2 * len(kept):  # nothing there but signed files
        if not fresh:
            return
    else:
        keep = [*kept, *(SIG + name for name in kept)]
        db.execute(f"DELETE FROM kernel_files WHERE key=? AND name NOT IN ({','.join('?' * len(keep))})",
                   (key, *keep))
    db.executemany("INSERT OR REPLACE INTO kernel_files VALUES (?, ?, ?, ?)",
                   [(key, name, data, now) for name, data in signed(signer, key, fresh).items()])
