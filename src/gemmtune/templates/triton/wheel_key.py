"""Triton's key of its own installation, shared among machines that installed the same Triton wheel.

`key_cache` keeps the key per machine, under a signature of the files' metadata (inodes and times),
so a new machine's first process still pays Triton's hash of itself (0.4 s on the H200's host, most of
it `libtriton.so`).  A wheel's `RECORD` lists every file it installed with its sha256 and size, so two
machines whose Triton files all match the same `RECORD` hold the same files, and Triton computes the
same key on both.  `signature()` is that shared identity:

- the digest of Triton's version, Python's version and extension suffix, and the `RECORD`'s bytes;
- given only when every file `key_cache` signs (a superset of those Triton hashes) is listed in the
  `RECORD` with its size, and none was modified after the `RECORD` was written (an edited file is
  newer than it).  A file the wheel did not install (an editable build, a plug-in backend), a size
  that differs, a newer file, or no `RECORD`: None, and the key is not shared.

Where kernels are shared (`Settings.share_kernels`), the store keeps the key under that signature
(`store.kernels`): a new machine reads it instead of hashing, and the first machine to hash writes it.
A key read from the store is used only in Triton's own form (`valid_key`); anything else is a miss.

Example:
    >>> import tempfile
    >>> signature(tempfile.mkdtemp(), "3.6.0") is None   # no RECORD beside it: nothing to share
    True
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
import re
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Callable

__all__ = ["signature", "signed_paths", "record_of", "share_with", "unshare", "shared_key", "valid_key"]

log = logging.getLogger("gemmtune")
DIRS = ("compiler", "backends", "language", "_C")
SLACK_NS = 2_000_000_000  # a file up to 2 s newer than the RECORD still counts as installed with it
_SHARED: dict[str, Callable] = {}
_DIGESTS = re.compile(r"[0-9a-f]{64}(?:-[0-9a-f]{64}){0,1000}")  # Triton hashes a few hundred files
_LOCK = threading.Lock()


def signed_paths(root: str | Path) -> list[Path]:
    """The files whose metadata `key_cache` signs: Triton's `runtime/cache.py` and every file under its
    `compiler/`, `backends/`, `language/` and `_C/` (a superset of what Triton hashes), in a fixed order.
    Linked folders are followed (an editable Triton links `backends/` and `language/extra/` into its
    sources, and Triton's own hash reads through them); a folder met twice is listed once.

    Example:
        >>> import tempfile
        >>> [p.name for p in signed_paths(tempfile.mkdtemp())]
        ['cache.py']
    """
    root = Path(root)
    paths = [root / "runtime" / "cache.py"]
    seen: set[str] = set()
    for sub in DIRS:
        for dirpath, dirnames, filenames in os.walk(root / sub, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen:
                dirnames[:] = []
                continue
            seen.add(real)
            dirnames.sort()
            paths += [Path(dirpath, f) for f in sorted(filenames) if not f.endswith((".pyc", ".pyo"))]
    return paths


def record_of(root: str | Path) -> Path | None:
    """The `RECORD` of the wheel that installed the Triton package at `root`: a `*triton*.dist-info`
    beside it whose `RECORD` lists `<package>/runtime/cache.py`; None where there is not exactly one."""
    root = Path(root)
    mark = f"{root.name}/runtime/cache.py,"
    found = []
    for info in sorted(root.parent.glob("*triton*.dist-info")):
        try:
            if mark in (info / "RECORD").read_text(errors="replace"):
                found.append(info / "RECORD")
        except OSError:
            continue
    return found[0] if len(found) == 1 else None


def signature(root: str | Path, version: str) -> str | None:
    """The shared identity of the Triton at `root` (see the module docstring), or None.

    Example:
        >>> import tempfile
        >>> signature(tempfile.mkdtemp(), "3.6.0") is None
        True
    """
    root = Path(root)
    record = record_of(root)
    if record is None:
        return None
    try:
        text = record.read_bytes()
        newest = record.stat().st_mtime_ns + SLACK_NS
        sizes = {row[0]: row[2] for row in csv.reader(io.StringIO(text.decode("utf-8", "replace")))
                 if len(row) >= 3 and row[1]}
        for path in signed_paths(root):
            st = path.stat()
            rel = f"{root.name}/{path.relative_to(root).as_posix()}"
            if sizes.get(rel) != str(st.st_size) or st.st_mtime_ns > newest:
                return None
    except (OSError, ValueError):
        return None
    h = hashlib.sha256(f"wheel|{version}|{sysconfig.get_config_var('EXT_SUFFIX')}|{sys.version}|".encode())
    h.update(text)
    return h.hexdigest()


def valid_key(key: object, version: str) -> bool:
    """Whether `key` has the form of Triton's key of an installation of Triton `version`
    (`triton.runtime.cache.triton_key`): the version, then sha256 digests joined by '-'.

    Example:
        >>> valid_key("3.6.0" + "ab" * 32 + "-" + "cd" * 32, "3.6.0"), valid_key("3.6.0-not-a-key", "3.6.0")
        (True, False)
    """
    return (isinstance(key, str) and key.startswith(version)
            and _DIGESTS.fullmatch(key, len(version)) is not None)


def share_with(get: Callable[[str], str | None], put: Callable[[str, str], None]) -> None:
    """Where the key is shared: `get(signature)` reads a kept key (None if none), `put(signature, key)`
    keeps one.  Either may raise: that is a miss, never an error."""
    with _LOCK:
        _SHARED.update(get=get, put=put)


def unshare() -> None:
    """No sharing in this process any more."""
    with _LOCK:
        _SHARED.clear()


def shared_key(root: str | Path, version: str, compute: Callable[[], str]) -> str:
    """The key kept under this installation's signature, else `compute()`, offered for keeping when
    the files still match the signature afterwards (they did not change while Triton hashed them).

    Example:
        >>> import tempfile
        >>> shared_key(tempfile.mkdtemp(), "3.6.0", lambda: "KEY")   # nothing shared: computed
        'KEY'
    """
    with _LOCK:
        get, put = _SHARED.get("get"), _SHARED.get("put")
    sig = signature(root, version) if get is not None else None
    if get is None or sig is None:
        return compute()
    try:
        kept = get(sig)
    except Exception as exc:  # noqa: BLE001 - a miss: Triton hashes itself
        log.info("gemmtune: Triton's key not read from the store: %s", exc)
        kept = None
    if valid_key(kept, version):
        log.info("gemmtune: Triton's key of its installation read from the store (its wheel's RECORD matches)")
        return str(kept)
    if kept is not None:
        log.warning("gemmtune: Triton's key read from the store under %s is not in Triton %s's form; "
                    "Triton hashes itself", sig[:16], version)
    key = compute()
    if put is not None and signature(root, version) == sig:
        try:
            put(sig, key)
        except Exception as exc:  # noqa: BLE001 - not kept; the next machine hashes
            log.info("gemmtune: Triton's key not kept in the store: %s", exc)
    return key
