"""Which processes hold a SQLite store: what lets a process tell that no other one runs its picks.

Every process that opens a store file takes a shared `flock` on a file beside it (`<store>.live`)
and keeps it while the store is open; a process holds the store *alone* when it can take that lock
exclusively.  `store.memory` replaces a pick that other processes may be running (a provisional
pick re-checked, a usable pick a partial hit decided against) only while it holds the store alone,
inside `exclusive()`: a process opening the store meanwhile waits the few milliseconds of that
write, then reads the new pick.  So every process holding the store runs the same pick.

The lock file is never written; it is opened without following a symbolic link.  Where it cannot
be opened or locked (a read-only directory, a file system without `flock`), or a lock is not granted
within the store's lock timeout, the process does not count as alone (it never replaces a pick
others may run), and its own hold is skipped with a log line.

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "s.sqlite")
    >>> mine = Presence.join(path, timeout_s=1.0)
    >>> mine.alone(), Presence.join(path, timeout_s=1.0) is mine
    (True, True)
    >>> with mine.exclusive() as alone:
    ...     alone
    True
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import threading
import time
import weakref
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux or macOS
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("gemmtune")
SUFFIX = ".live"
_HELD: dict[tuple[int, str], "Presence"] = {}  # (pid, lock file) -> this process's hold
_GUARD = threading.Lock()
_RELEASED: collections.deque = collections.deque()  # holds whose Store is gone, released under `_GUARD`


def _after_fork() -> None:  # a forked child takes holds of its own (its pid keys them); the lock starts free
    global _GUARD
    _GUARD = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class Presence:
    """This process's shared hold on one store file (one per process and file, whatever the number of
    Store objects on it; dropped when the last of them is gone)."""

    def __init__(self, fd: int, name: str):
        self.fd, self.name = fd, name
        self.owners = 0
        self._use = threading.RLock()  # one thread at a time converts the lock

    @classmethod
    def join(cls, store_path: str, timeout_s: float, owner: object = None) -> "Presence | None":
        """This process's hold on `store_path` (taken now if it holds none), kept while `owner` (a Store)
        lives, or None where it cannot be taken."""
        if fcntl is None:
            return None
        name = os.path.abspath(store_path) + SUFFIX
        with _GUARD:
            _drain()
            held = _HELD.get((os.getpid(), name))
            if held is None:
                fd = _open(name)
                if fd is None or not _lock(fd, fcntl.LOCK_SH, timeout_s):
                    if fd is not None:
                        os.close(fd)
                    log.info("gemmtune: no hold on %s (another process locks it, or it cannot be opened): this "
                             "process never replaces a pick other processes may run", name)
                    return None
                held = _HELD[(os.getpid(), name)] = cls(fd, name)
            if owner is not None:
                held.owners += 1
                weakref.finalize(owner, held._release)
            return held

    def _release(self) -> None:
        """A Store on this hold is gone.  A weakref finalizer: it can run inside the garbage collector
        while this very thread holds `_GUARD` (in `join`), so it never waits for it: the release is
        queued and made now where the guard is free, else by the next `join`."""
        _RELEASED.append(self)
        if _GUARD.acquire(blocking=False):
            try:
                _drain()
            finally:
                _GUARD.release()

    def alone(self) -> bool:
        """Whether no other process holds the store now."""
        with self.exclusive() as alone:
            return alone

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[bool]:
        """Hold the store exclusively for the block where no other process holds it (yields True);
        else yields False at once.  The shared hold is taken back on leaving."""
        with self._use:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_SH)


def _drain() -> None:
    """Make the queued releases (the caller holds `_GUARD`): a hold whose last Store is gone is closed."""
    while _RELEASED:
        gone: Presence = _RELEASED.popleft()
        gone.owners -= 1
        if gone.owners > 0 or _HELD.get((os.getpid(), gone.name)) is not gone:
            continue
        del _HELD[(os.getpid(), gone.name)]
        os.close(gone.fd)


def _open(name: str) -> int | None:
    """The lock file, created if missing (never truncated, never through a symbolic link)."""
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None
    return None


def _lock(fd: int, how: int, timeout_s: float) -> bool:
    """Take `how` on `fd`, polling until `timeout_s` has passed (another process's exclusive hold is a
    single write: milliseconds)."""
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK) or time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
