"""A problem's sizes, checked without torch: `--shape MxKxN` and the batch, before anything is imported
or allocated (`offline/suite.py` builds its specs on these checks; the command line runs them first)."""

from __future__ import annotations

import reprlib

from ..core.errors import InputError

__all__ = ["MAX_DIM", "MAX_OPERAND_BYTES", "parse_shape", "check_dims"]

MAX_DIM = 2**31 - 1
"""The largest M, K, N or batch a spec takes (torch's kernels index a dimension with 32-bit integers)."""
MAX_OPERAND_BYTES = 2**63 - 1
"""No operand (A, B or the output) may need more bytes, as float64, than torch can address."""


def parse_shape(shape: str) -> tuple[int, int, int]:
    """`--shape` MxKxN as three integers (`*` also separates); InputError unless it is three of them.

    Example:
        >>> parse_shape("64x32*16")
        (64, 32, 16)
        >>> parse_shape("64x32")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: --shape: expected MxKxN with three positive integers, got '64x32'
    """
    parts = shape.lower().replace("*", "x").split("x")
    try:
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError("not three integers")
        M, K, N = (int(p) for p in parts)  # ValueError past Python's limit on digits
    except ValueError:
        raise InputError(f"--shape: expected MxKxN with three positive integers, got {reprlib.repr(shape)}") from None
    return M, K, N


def check_dims(M: int, K: int, N: int, batch: int = 1) -> None:
    """InputError unless M, K, N and batch are positive integers of at most MAX_DIM, and A, B and the
    output each fit what torch can allocate (as the float64 copies tuning makes).

    Example:
        >>> check_dims(64, 32, 16)
        >>> check_dims(64, 0, 16)
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: shape: K must be a positive integer, got 0
    """
    for dim, v in (("M", M), ("K", K), ("N", N), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"shape: {dim} must be a positive integer, got {v!r}")
        if v > MAX_DIM:
            shown = v if v.bit_length() <= 128 else f"a {v.bit_length()}-bit integer"
            raise InputError(f"shape: {dim} must be at most {MAX_DIM} (2**31 - 1), got {shown}")
    for name, rows, cols in (("A", M, K), ("B", K, N), ("the output", M, N)):
        elements = batch * rows * cols
        if elements * 8 > MAX_OPERAND_BYTES:
            raise InputError(f"shape: {batch}x{M}x{K}x{N} (batch x M x K x N) is too large: "
                             f"{name} has {elements:.3g} elements, more than torch can allocate")
