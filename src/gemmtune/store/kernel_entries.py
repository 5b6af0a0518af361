"""Files kept under a key of a store's `kernel_files` (compiled kernels, native modules, Inductor's
kernel configs, the in-model verdicts), read as untrusted input (docs/RELIABILITY.md).

- **signed**: a store with a key (`Settings.store_key`) keeps each file with a signature entry beside
  it, `__sig__NAME`, over the kernel's key, the file's name and the sha256 of its bytes; a reader with
  a key gets only the files whose signature verifies, and a writer with a key replaces entries that do
  not.  Entries rather than a column: both stores keep them as they keep any file (no schema change;
  a moved-aside SQLite file, an export, a Redis hash copy them as they are);
- **bounded**: a store checks sizes before it loads anything (SQLite `length(data)`, Redis
  `HSTRLEN`).  A file over `MAX_FILE_BYTES` or with a name that is not a plain ASCII file name is left
  out; a key with more than `MAX_ENTRIES` entries, or whose files weigh more than `MAX_KERNEL_BYTES`
  together, is read as empty.

Whatever is left out or fails to verify is skipped with one warning naming the store and the key
(once per process), and counted in `skipped`.

Example:
    >>> from gemmtune.store.signing import Signer
    >>> signer = Signer.from_text("a-fleet-secret-of-32-characters!")
    >>> entries = signed(signer, "KEY", {"k.cubin": b"binary"})
    >>> sorted(entries)
    ['__sig__k.cubin', 'k.cubin']
    >>> verified(signer, "KEY", entries, "store.sqlite")
    {'k.cubin': b'binary'}
    >>> verified(signer, "OTHER", entries, "store.sqlite", quiet=True)   # copied under another key
    {}
    >>> verified(None, "KEY", entries, "store.sqlite")                   # no key: nothing to check
    {'k.cubin': b'binary'}
"""

from __future__ import annotations

import collections
import hashlib
import logging
import re
import threading
import warnings
from typing import Any, Iterable

__all__ = ["SIG", "MAX_FILE_BYTES", "MAX_KERNEL_BYTES", "MAX_ENTRIES", "MAX_NAME_CHARS", "NAME",
           "signed", "verified", "within_bounds", "whole", "skip", "skipped"]

log = logging.getLogger("gemmtune")
SIG = "__sig__"  # a signature entry's name: SIG + the file's name
KIND = "kernel_file"  # the first signed part: a kernel file's signature is no other entry's
MAX_FILE_BYTES = 32 << 20  # one file (a cubin, a native module, a config)
MAX_KERNEL_BYTES = 64 << 20  # every file under one key together
MAX_ENTRIES = 1024  # entries under one key, signatures included
MAX_NAME_CHARS = 255
NAME = re.compile(r"[A-Za-z0-9._+-]{1,%d}" % MAX_NAME_CHARS)  # what Triton, Inductor and gemmtune name files
skipped: collections.Counter = collections.Counter()  # entries skipped in this process, by reason
_SAID: set[tuple[str, str, str]] = set()
_LOCK = threading.Lock()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def signed(signer: Any, key: str, files: dict[str, bytes]) -> dict[str, bytes]:
    """`files` with a signature entry beside each (no signer: `files` as they are)."""
    if signer is None:
        return dict(files)
    sigs = {SIG + name: signer.sign(KIND, key, name, _digest(data)).encode() for name, data in files.items()}
    return {**files, **sigs}


def verified(signer: Any, key: str, entries: dict[str, bytes], where: str, quiet: bool = False) -> dict[str, bytes]:
    """The files among `entries` (signature entries removed) whose signature verifies under `signer`;
    with no signer, every file.  Files that do not verify are skipped with a warning (`quiet`: not)."""
    files = {name: data for name, data in entries.items() if not name.startswith(SIG)}
    if signer is None:
        return files
    good = {}
    for name, data in files.items():
        sig = entries.get(SIG + name)
        try:
            text = sig.decode("ascii") if isinstance(sig, bytes) else None
        except UnicodeDecodeError:
            text = None
        if signer.verify(text, KIND, key, name, _digest(data)):
            good[name] = data
    if len(good) < len(files) and not quiet:
        bad = sorted(set(files) - set(good))
        skip(where, key, "unsigned", f"{len(bad)} file(s) unsigned or badly signed ({', '.join(bad[:3])})")
    return good


def within_bounds(sizes: Iterable[tuple[Any, Any]], where: str, key: str) -> tuple[list[str], bool]:
    """(the names to load, whether nothing was left out) given each entry's (name, size in bytes, None
    where its value is not bytes), as a store reads them before loading anything.  Too many entries,
    or too much together: nothing to load.

    Example:
        >>> within_bounds([("k.cubin", 10), ("k.json", 2)], "store.sqlite", "KEY")
        (['k.cubin', 'k.json'], True)
    """
    sizes = list(sizes)
    if len(sizes) > MAX_ENTRIES:
        skip(where, key, "oversized", f"more than {MAX_ENTRIES} entries")
        return [], False
    names = [n for n, size in sizes if isinstance(n, str) and NAME.fullmatch(n) and isinstance(size, int)
             and 0 <= size <= MAX_FILE_BYTES]
    total = sum(size for n, size in sizes if n in names)
    if total > MAX_KERNEL_BYTES:
        skip(where, key, "oversized", f"{total} bytes together, over the bound of {MAX_KERNEL_BYTES}")
        return [], False
    if len(names) < len(sizes):
        skip(where, key, "oversized", f"{len(sizes) - len(names)} entries over {MAX_FILE_BYTES} bytes, "
                                      "not bytes, or not named as a file")
    return names, len(names) == len(sizes)


def whole(signer: Any, key: str, entries: dict[str, bytes], complete: bool) -> bool:
    """Whether a key's entries are all there and, with a signer, every file verifies: nothing to write.

    Example:
        >>> whole(None, "KEY", {"k.cubin": b"..."}, complete=True), whole(None, "KEY", {}, complete=True)
        (True, False)
    """
    files = [n for n in entries if not n.startswith(SIG)]
    if not complete or not files:
        return False
    return signer is None or len(verified(signer, key, entries, "", quiet=True)) == len(files)


def skip(where: str, key: str, reason: str, why: str) -> None:
    """Count a skipped entry and say so, once per process, store, key and reason (`skipped` counts it).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     before = skipped["oversized"]; skip("store.sqlite", "KEY", "oversized", "a doctest")
        >>> skipped["oversized"] - before
        1
    """
    with _LOCK:
        skipped[reason] += 1
        if (where, key, reason) in _SAID:
            return
        _SAID.add((where, key, reason))
    message = f"gemmtune: store {where}: kernel files under {key[:80]} skipped: {why}"
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
