"""What a process trusts of a store, decided once from its Settings (docs/RELIABILITY.md).

- `signer`: with `Settings.store_key`, every entry written is signed and only entries that verify are
  read (`store.signing`); without it, entries are unsigned and item by item checked as untrusted input.
- `shared`: "auto" (a Redis store, and a SQLite file another user owns or may write, count as shared:
  `others_may_write`) or "on" (every store does).  Whatever a shared store answers (a pick, a timing
  that wins) runs only after it passed the correctness gate in this process (`store.checked`).  A
  SQLite file only this user (or root) can write is trusted as the user's own cache.
- `lock_timeout_s`: how long a SQLite store that another process keeps locked is waited on.

Example:
    >>> from gemmtune.core.settings import Settings
    >>> t = Trust.of(Settings(store_key="0123456789abcdef", store_shared="on"))
    >>> t.signer is not None, t.shared, t.fingerprint[1:]
    (True, 'on', ('on', 5.0))
    >>> Trust.of(Settings()).signer is None
    True
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .signing import Signer

__all__ = ["Trust", "others_may_write"]


@dataclass(frozen=True)
class Trust:
    """A store's trust policy in this process (see the module docstring)."""

    signer: Signer | None = None
    shared: str = "auto"
    lock_timeout_s: float = 5.0

    @classmethod
    def of(cls, settings: Any) -> "Trust":
        """The policy of `settings` (a `gemmtune.Settings`)."""
        key = settings.store_key
        return cls(Signer.from_text(key) if key is not None else None, settings.store_shared,
                   settings.store_lock_timeout_s)

    @property
    def fingerprint(self) -> tuple:
        """What tells two policies apart (no secret in it): one store object per location and policy."""
        return (self.signer.key_ids if self.signer else None, self.shared, self.lock_timeout_s)


def others_may_write(path: str | Path) -> str | None:
    """Why another user may have written the SQLite store at `path`, else None: the file or its
    directory is owned by a user other than this one (root aside), or is group- or other-writable (a
    sticky directory only where the file is ours), following a symbolic link to its target too.  A
    file that does not exist yet is judged by its directory.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); d.chmod(0o700)
        >>> (d / "s.sqlite").touch(); (d / "s.sqlite").chmod(0o600)
        >>> others_may_write(d / "s.sqlite") is None
        True
        >>> (d / "s.sqlite").chmod(0o666); others_may_write(d / "s.sqlite")
        'its file is group- or other-writable'
    """
    path = Path(path)
    places = [path]
    if path.is_symlink():
        places.append(path.resolve())
    for place in places:
        why = _file_why(place) or _dir_why(place)
        if why is not None:
            return why if place == path else f"{why} (the target of a symbolic link)"
    return None


def _owner_why(st: os.stat_result, what: str) -> str | None:
    if st.st_uid not in (os.geteuid(), 0):
        return f"its {what} is owned by another user (uid {st.st_uid})"
    return f"its {what} is group- or other-writable" if st.st_mode & 0o022 else None


def _file_why(path: Path) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None  # not there yet: the directory decides
    return _owner_why(st, "file")


def _dir_why(path: Path) -> str | None:
    try:
        st = os.stat(path.parent)
    except OSError:
        return None
    why = _owner_why(st, "directory")
    if why is not None and st.st_uid in (os.geteuid(), 0) and st.st_mode & stat.S_ISVTX:
        try:  # a sticky directory (/tmp): others may add files, but not replace ours
            return why if os.stat(path).st_uid != os.geteuid() else None
        except OSError:
            return why  # not there yet: another user may create it first
    return why
