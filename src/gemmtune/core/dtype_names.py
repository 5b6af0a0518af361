"""The dtype names gemmtune takes, checked without torch (the command line checks `--dtype` before it
imports torch; `core.inputs.parse_dtype` maps a checked name to the torch dtype)."""

from __future__ import annotations

from .errors import InputError

__all__ = ["NAMES", "FP8_NAMES", "ALIASES", "canonical"]

NAMES = ("float16", "bfloat16", "float32", "float64")
"""The dtypes of mm, addmm and bmm problems."""
FP8_NAMES = ("float8_e4m3fn", "float8_e5m2")
"""The operand dtypes of scaled_mm problems."""
ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
           "fp64": "float64", "double": "float64", "e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn",
           "e5m2": "float8_e5m2"}
"""Short names and torch's other spellings, by the name they stand for."""


def canonical(name: str) -> str:
    """The dtype `name` stands for (`bf16`, `torch.float16`, `FP32`, ...); InputError naming the supported ones.

    Example:
        >>> canonical("bf16"), canonical("torch.float16")
        ('bfloat16', 'float16')
        >>> canonical("int8")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: dtype: unsupported dtype 'int8'; use one of float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2
    """
    key = name.replace("torch.", "").lower()
    key = ALIASES.get(key, key)
    if key not in NAMES + FP8_NAMES:
        raise InputError(f"dtype: unsupported dtype {name!r}; use one of {', '.join(NAMES + FP8_NAMES)}")
    return key
