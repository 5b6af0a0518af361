"""A secret setting (`Settings.store_key`): its value never prints.

Example:
    >>> s = parse_secret("0123456789abcdef"); s, str(s)
    (Secret('***'), '***')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Secret", "parse_secret", "MIN_KEY_CHARS", "MAX_KEY_CHARS"]

MIN_KEY_CHARS = 16  # a shorter secret is refused: it could be guessed
MAX_KEY_CHARS = 4096


@dataclass(frozen=True)
class Secret:
    """A secret that never prints (its repr and str are `***`); `reveal()` gives the text.

    Example:
        >>> s = Secret("0123456789abcdef"); str(s), s.reveal()[:4]
        ('***', '0123')
    """

    value: str = field(repr=False)

    def reveal(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"


def parse_secret(value: Any) -> Secret:
    """A `store_key` setting's value as a Secret: one key or several, comma-separated, each at least
    `MIN_KEY_CHARS` characters; ValueError otherwise (the message never quotes the key).

    Example:
        >>> parse_secret("0123456789abcdef, fedcba9876543210")
        Secret('***')
        >>> parse_secret("short")
        Traceback (most recent call last):
        ValueError: a store key must be at least 16 characters (got one of 5); keys are comma-separated
    """
    if isinstance(value, Secret):
        value = value.reveal()
    if not isinstance(value, str):
        raise ValueError(f"expected the key as a string, got {type(value).__name__}")
    if len(value) > MAX_KEY_CHARS:
        raise ValueError(f"a store key setting must be at most {MAX_KEY_CHARS} characters")
    keys = [k.strip() for k in value.split(",")]
    for k in keys:
        if len(k) < MIN_KEY_CHARS:
            raise ValueError(f"a store key must be at least {MIN_KEY_CHARS} characters (got one of {len(k)}); "
                             "keys are comma-separated")
    return Secret(",".join(keys))
