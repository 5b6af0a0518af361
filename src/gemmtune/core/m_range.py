"""M ranges as callers name them (`gemmtune.warmup(..., m=...)`, `gemmtune.tune_buckets`, the CLI's `--m`).

An M axis is split into power-of-two buckets: bucket `b` holds M in (b/2, b] and is tuned at M = b.

Example:
    >>> parse_m("1:4096")
    [1, 4096]
    >>> [bucket_of(m) for m in (1, 2, 3, 64, 65, 4096)], buckets_for([1, 5, 100])
    ([1, 2, 4, 64, 128, 4096], [1, 2, 4, 8, 16, 32, 64, 128])
"""

from __future__ import annotations

from typing import Any, Iterable

from .errors import InputError

__all__ = ["MAX_M", "parse_m", "bucket_of", "buckets_for"]

MAX_M = 1 << 24
"""The largest M a range may name."""


def parse_m(m: Any, source: str = "m") -> list[int]:
    """The M values `m` names, sorted: a range (its ends), a list or tuple of integers, or text "LO:HI"
    (the CLI's `--m`).  The buckets between the smallest and the largest are what gets tuned.

    Example:
        >>> parse_m(range(1, 4097)), parse_m("16:64"), parse_m([8, 2, 8])
        ([1, 4096], [16, 64], [2, 8])
        >>> parse_m("0:10")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: m: M must be from 1 to 16777216, got '0:10'
    """
    if isinstance(m, str):
        parts = m.split(":")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise InputError(f"{source}: expected LO:HI (two integers), got {m!r}")
        values = [int(p) for p in parts]
        if values[0] > values[1]:
            raise InputError(f"{source}: LO is above HI in {m!r}")
    elif isinstance(m, range):
        values = [m.start, m[-1]] if len(m) and m.step > 0 else []
    elif isinstance(m, (list, tuple)) and all(type(v) is int for v in m):
        values = list(m)
    else:
        raise InputError(f"{source}: expected a range, a list of integers or LO:HI, got {m!r}")
    if not values:
        raise InputError(f"{source}: names no M ({m!r})")
    if min(values) < 1 or max(values) > MAX_M:
        raise InputError(f"{source}: M must be from 1 to {MAX_M}, got {m!r}")
    return sorted(set(values))


def bucket_of(m: int) -> int:
    """The bucket of `m` (>= 1): the smallest power of two >= m."""
    return 1 << max(0, (m - 1).bit_length())


def buckets_for(ms: Iterable[int]) -> list[int]:
    """Every bucket from the smallest M's to the largest's, ascending."""
    ms = list(ms)
    lo, hi = bucket_of(min(ms)), bucket_of(max(ms))
    return [1 << i for i in range(lo.bit_length() - 1, hi.bit_length())]
