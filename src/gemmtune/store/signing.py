"""Signed store entries: HMAC-SHA256 under a secret the machines of a fleet share (docs/RELIABILITY.md).

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

__all__ = ["Secret", "Signer", "Prefixed", "MIN_KEY_CHARS", "VERSION", "key_id", "parse_secret"]

VERSION = "v1"
_SIG_CHARS = len(VERSION) + 1 + 8 + 1 + 64  # "v1:KEYID:HEXMAC"
_HEAD = VERSION + ":"


def key_id(key: bytes) -> str:
    """A short public name of a key (8 hex digits of a digest of it): what a signature says it was made with.

    Example:
        >>> len(key_id(b"0123456789abcdef"))
        8
    """
    return hashlib.sha256(b"gemmtune-store-key-id\0" + key).hexdigest()[:8]


def _message(parts: Sequence[str]) -> bytes:
    """The signed bytes, so that no two part lists give the same message: the parts joined by NUL
    after a 0 byte where no part holds a NUL (the common case, and cheap), else each part
    length-prefixed after a 1 byte.

    Example:
        >>> _message(["a", "b"]), _message(["a\\0b"]) != _message(["a", "b"])
        (b'\\x00a\\x00b', True)
    """
    text = "\0".join(parts)
    if text.count("\0") == len(parts) - 1:
        return b"\0" + text.encode("utf-8", "surrogatepass")
    return b"\1" + _frames(parts)


def _frames(parts: Sequence[str]) -> bytes:
    out = []
    for p in parts:
        data = p.encode("utf-8", "surrogatepass")
        out.append(len(data).to_bytes(8, "big"))
        out.append(data)
    return b"".join(out)


def _pads(key: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256's inner and outer hash states for `key` (RFC 2104), computed once per key: a MAC
    is then two copies and two updates (`hmac.new` sets them up again for every message)."""
    if len(key) > 64:
        key = hashlib.sha256(key).digest()
    key = key.ljust(64, b"\0")
    return hashlib.sha256(bytes(b ^ 0x36 for b in key)), hashlib.sha256(bytes(b ^ 0x5C for b in key))


def _mac(pads: tuple[Any, Any], message: bytes) -> str:
    """HMAC-SHA256 of `message` (hex) from a key's `_pads`: `hmac.new(key, message, sha256).hexdigest()`."""
    inner, outer = pads[0].copy(), pads[1].copy()
    inner.update(message)
    outer.update(inner.digest())
    return outer.hexdigest()


def _split(signature: Any) -> tuple[str, str] | None:
    """(key id, hex MAC) of a well-formed signature of this version, else None."""
    if not isinstance(signature, str) or len(signature) != _SIG_CHARS:
        return None
    version, kid, mac = (signature.split(":") + ["", ""])[:3]
    return (kid, mac) if version == VERSION else None


def _advanced(state: Any, data: bytes) -> Any:
    state = state.copy()
    state.update(data)
    return state


class Prefixed:
    """Verifies many entries whose signed parts start alike (the rows of one problem) faster: the
    common parts are hashed once (`Signer.prefixed`); the MAC is the one `Signer.verify` checks."""

    def __init__(self, pads: dict[str, tuple[Any, Any]], prefix: Sequence[str]):
        if not prefix:
            raise ValueError("a prefix of at least one part")
        text = "\0".join(prefix)
        clean = text.count("\0") == len(prefix) - 1  # no NUL in the prefix: the cheap framing may follow
        head0, head1 = b"\0" + text.encode("utf-8", "surrogatepass"), b"\1" + _frames(prefix)
        self._zero = {kid: _advanced(i, head0) for kid, (i, _) in pads.items()} if clean else None
        self._one = {kid: _advanced(i, head1) for kid, (i, _) in pads.items()}
        self._outer = {kid: o for kid, (_, o) in pads.items()}

    def verify(self, signature: Any, *rest: str) -> bool:
        """Whether `signature` signs the prefix followed by `rest` (as `Signer.verify` would say)."""
        if not isinstance(signature, str) or len(signature) != _SIG_CHARS or signature[:3] != _HEAD:
            return False
        kid, mac = signature[3:11], signature[12:]
        outer = self._outer.get(kid)
        if outer is None or signature[11] != ":":
            return False
        text = "\0".join(rest)
        if self._zero is not None and (not rest or text.count("\0") == len(rest) - 1):
            inner = self._zero[kid].copy()
            if rest:
                inner.update(b"\0" + text.encode("utf-8", "surrogatepass"))
        else:
            inner = self._one[kid].copy()
            inner.update(_frames(rest))
        outer = outer.copy()
        outer.update(inner.digest())
        return hmac.compare_digest(outer.hexdigest(), mac)


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
        self._pads = {kid: _pads(k) for kid, k in self._keys.items()}

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
        mac = _mac(self._pads[key_id(self._sign_key)], _message(parts))
        return f"{VERSION}:{key_id(self._sign_key)}:{mac}"

    def verify(self, signature: Any, *parts: str) -> bool:
        """Whether `signature` signs `parts` under one of the keys (anything malformed: False)."""
        got = _split(signature)
        pads = self._pads.get(got[0]) if got is not None else None
        if got is None or pads is None:
            return False
        return hmac.compare_digest(_mac(pads, _message(parts)), got[1])

    def prefixed(self, *prefix: str) -> Prefixed:
        """A verifier of entries whose parts start with `prefix` (hashed once).

        Example:
            >>> s = Signer.from_text("a-fleet-secret-of-32-characters!")
            >>> s.prefixed("row", "env", "p").verify(s.sign("row", "env", "p", "x"), "x")
            True
        """
        return Prefixed(self._pads, prefix)
