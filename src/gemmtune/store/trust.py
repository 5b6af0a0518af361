"""What a process trusts of a store, decided once from its Settings (docs/SECURITY.md).

- `signer`: with `Settings.store_key`, every entry written is signed and only entries that verify are
  read (`store.signing`); without it, entries are unsigned and item by item checked as untrusted input.
- `shared`: "auto" (a Redis store, and a SQLite file another user owns or may write, count as shared)
  or "on" (every store does).  A pick read from a shared store runs only after it passed the
  correctness gate in this process (`store.checked`).
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

from dataclasses import dataclass
from typing import Any

from .signing import Signer

__all__ = ["Trust"]


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
