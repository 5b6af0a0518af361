"""Signed store entries: HMAC-SHA256 under a secret the machines of a fleet share (docs/SECURITY.md).

A store opened with a key (`Settings.store_key`, `GEMMTUNE_STORE_KEY`) signs every entry it writes
and reads only the entries that verify: an unsigned or badly signed entry is skipped with a warning
naming the store and the key, as a malformed one is.  The signature covers the entry's kind, its key
parts (environment, problem, field) and its value, so an entry copied under another problem or
another kind does not verify.

Several keys may be given, comma-separated: the first signs, every one verifies (a key is rotated by
adding the new one first, then dropping the old one once every writer has the new one).  A key is
never printed: `Secret` shows `***`, and a signature names its key only by a short digest (`key_id`).

Example:
    >>> signer = Signer.from_text("a-fleet-secret-of-32-characters!")
    >>> sig = signer.sign("pick", "env", "problem", '{"template":"aten_mm"}')
    >>> signer.verify(sig, "pick", "env", "problem", '{"template":"aten_mm"}')
    True
    >>> signer.verify(sig, "pick", "env", "other-problem", '{"template":"aten_mm"}')
    False
    >>> Secret("a-fleet-secret-of-32-characters!")
    Secret('***')
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Sequence

from ..core.secret import MAX_KEY_CHARS, MIN_KEY_CHARS, Secret, parse_secret

__all__ = ["Secret", "Signer", "MIN_KEY_CHARS", "VERSION", "key_id", "parse_secret"]

VERSION = "v1"
_SIG_CHARS = len(VERSION) + 1 + 8 + 1 + 64  # "v1:KEYID:HEXMAC"


def key_id(key: bytes) -> str:
    """A short public name of a key (8 hex digits of a digest of it): what a signature says it was made with.

    Example:
        >>> len(key_id(b"0123456789abcdef"))
        8
    """
    return hashlib.sha256(b"gemmtune-store-key-id\0" + key).hexdigest()[:8]


def _message(parts: Sequence[str]) -> bytes:
    """The signed bytes: each part length-prefixed, so no two part lists give the same message."""
    out = bytearray()
    for p in parts:
        data = p.encode("utf-8", "surrogatepass")
        out += len(data).to_bytes(8, "big") + data
    return bytes(out)


class Signer:
    """Signs and verifies entries under one or more keys (the first signs).

    Example:
        >>> old, new = Signer.from_text("the-old-key-0123"), Signer.from_text("the-new-key-0123,the-old-key-0123")
        >>> new.verify(old.sign("row", "x"), "row", "x"), old.verify(new.sign("row", "x"), "row", "x")
        (True, False)
    """

    def __init__(self, keys: Sequence[bytes]):
        if not keys:
            raise ValueError("a Signer needs at least one key")
        self._sign_key = keys[0]
        self._keys = {key_id(k): k for k in keys}

    @classmethod
    def from_text(cls, text: str | Secret) -> "Signer":
        """A Signer for a `store_key` setting's value (see `parse_secret`)."""
        return cls([k.encode() for k in parse_secret(text).reveal().split(",")])

    @property
    def key_id(self) -> str:
        """The signing key's public name."""
        return key_id(self._sign_key)

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key's public name, the signing key's first."""
        return (self.key_id, *sorted(k for k in self._keys if k != self.key_id))

    def __repr__(self) -> str:
        return f"Signer(key_id={self.key_id!r}, keys={len(self._keys)})"

    def sign(self, *parts: str) -> str:
        """The signature of `parts` ("v1:KEYID:HEXMAC")."""
        mac = hmac.new(self._sign_key, _message(parts), hashlib.sha256).hexdigest()
        return f"{VERSION}:{key_id(self._sign_key)}:{mac}"

    def verify(self, signature: Any, *parts: str) -> bool:
        """Whether `signature` signs `parts` under one of the keys (anything malformed: False)."""
        if not isinstance(signature, str) or len(signature) != _SIG_CHARS:
            return False
        version, kid, mac = (signature.split(":") + ["", ""])[:3]
        key = self._keys.get(kid)
        if version != VERSION or key is None:
            return False
        want = hmac.new(key, _message(parts), hashlib.sha256).hexdigest()
        return hmac.compare_digest(want, mac)
