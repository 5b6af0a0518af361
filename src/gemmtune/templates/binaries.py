"""The files of the binaries a template builds, reported to whoever compiles it.

A template that compiles through a compiler with an on-disk cache (Triton) reports each binary it
built or loaded: the compiler's cache key and its files (`BinaryFiles`).  The compile step collects
them per choice (`collect`, one list per compiling thread), and a store that shares compiled kernels
keeps the pick's (`gemmtune.store.kernels`), so another machine loads the pick instead of compiling it.

Example:
    >>> with collect() as got:
    ...     report(BinaryFiles("KEY", {"k.json": "/tmp/k.json"}))
    >>> got
    [BinaryFiles(key='KEY', files={'k.json': '/tmp/k.json'})]
    >>> report(BinaryFiles("KEY", {}))   # nobody collecting: nothing happens
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

_LOCAL = threading.local()


@dataclass(frozen=True)
class BinaryFiles:
    """One compiled binary in its compiler's cache: the cache's key for it (Triton: the base32 form of
    the kernel's hash, the name of its cache directory) and its files, name -> path."""

    key: str
    files: Mapping[str, str]


@contextmanager
def collect() -> Iterator[list[BinaryFiles]]:
    """Collect what `report` is told in this thread inside the block (nested blocks collect apart)."""
    outer = getattr(_LOCAL, "got", None)
    got: list[BinaryFiles] = []
    _LOCAL.got = got
    try:
        yield got
    finally:
        _LOCAL.got = outer


def report(binary: BinaryFiles) -> None:
    """Tell this thread's `collect` block about a binary built or loaded (none open: ignored)."""
    got = getattr(_LOCAL, "got", None)
    if got is not None:
        got.append(binary)


__all__ = ["BinaryFiles", "collect", "report"]
