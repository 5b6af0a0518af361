"""One `Spec` per setting: its type, how it is read from an environment string, its valid values, its doc.

`Settings` (core/settings.py) attaches a Spec to each dataclass field; `from_env`, validation and the
docs/SETTINGS.md table are all driven by these specs, so the three cannot disagree.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable

from .errors import SettingsError

BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
"""The only spellings a boolean variable accepts (any case).  Anything else is an error: a typo such as
`GEMMTUNE_CHECK_CORRECTNESS=ture` must not silently turn a safety check off."""


def parse_bool(raw: str) -> bool:
    """`raw` as a boolean; ValueError for any spelling outside `BOOL_WORDS`.

    Example:
        >>> parse_bool("Yes"), parse_bool("OFF")
        (True, False)
    """
    word = raw.strip().lower()
    if word not in BOOL_WORDS:
        raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), got {raw!r}")
    return BOOL_WORDS[word]


def parse_int(raw: str) -> int:
    """`raw` as a base-10 integer; ValueError naming the text otherwise."""
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {raw!r}") from None


def parse_float(raw: str) -> float:
    """`raw` as a float (range and finiteness are the Spec's check, not the parser's)."""
    try:
        return float(raw.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {raw!r}") from None


def _num(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Spec:
    """How one setting is typed, parsed from the environment, checked and documented.

    `kind` is "bool", "int", "float", "choice" or "text"; `lo`/`hi` bound numbers (`lo_open`: `lo` itself
    refused); `optional`: None is allowed (an optional number also reads "none" from the environment);
    `parser`/`checker` replace the kind's own for structured values; `error` is the exception raised.

    Example:
        >>> Spec("int", "configs kept", lo=1).validate("top_x", 0)
        Traceback (most recent call last):
        gemmtune.core.errors.SettingsError: top_x: must be >= 1, got 0
    """

    kind: str
    doc: str
    choices: tuple[str, ...] = ()
    lo: float | None = None
    lo_open: bool = False
    hi: float | None = None
    hi_open: bool = False
    optional: bool = False
    parser: Callable[[str], Any] | None = None
    checker: Callable[[Any], Any] | None = None
    type_text: str = ""
    range_note: str = ""
    error: type[Exception] = SettingsError

    def parse(self, raw: str) -> Any:
        """The value of an environment string; ValueError(problem) when it cannot be read."""
        if self.parser is not None:
            return self.parser(raw)
        if self.optional and self.kind in ("int", "float") and raw.strip().lower() == "none":
            return None
        if self.kind == "bool":
            return parse_bool(raw)
        if self.kind == "int":
            return parse_int(raw)
        if self.kind == "float":
            return parse_float(raw)
        return raw.strip()

    def check(self, value: Any) -> Any:
        """`value` normalised (int -> float for floats, path -> str), or ValueError(problem)."""
        if value is None:
            if self.optional:
                return None
            raise ValueError("must be set, got None")
        if self.checker is not None:
            return self.checker(value)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"expected True or False, got {type(value).__name__} {value!r}")
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise ValueError(f"expected one of {', '.join(self.choices)}, got {value!r}")
            return value
        if self.kind == "text":
            if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
                raise ValueError(f"expected a non-empty string, got {type(value).__name__} {value!r}")
            return os.fspath(value)
        return self._check_number(value)

    def _check_number(self, value: Any) -> Any:
        want = numbers.Integral if self.kind == "int" else numbers.Real
        if isinstance(value, bool) or not isinstance(value, want):
            noun = "an integer" if self.kind == "int" else "a number"
            raise ValueError(f"expected {noun}, got {type(value).__name__} {value!r}")
        value = int(value) if self.kind == "int" else float(value)  # type: ignore[call-overload]
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number {self.range_text()}".rstrip() + f", got {value}")
        low = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        high = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        if low or high:
            raise ValueError(f"must be {self.range_text()}, got {value}")
        return value

    def validate(self, label: str, value: Any) -> Any:
        """`check`, with a failure raised as `self.error` whose message starts with `label`."""
        try:
            return self.check(value)
        except ValueError as exc:
            raise self.error(f"{label}: {exc}") from None

    def range_text(self) -> str:
        """The valid values in words, e.g. ">= 1", "> 0", "in [0, 0.5)", "one of read, write"."""
        if self.range_note:
            return self.range_note
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "bool":
            return "1/0, true/false, yes/no, on/off (any case)"
        if self.kind == "text":
            return "non-empty"
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        return ""

    def describe_type(self) -> str:
        """The type column of the settings table."""
        text = self.type_text or {"choice": "str", "text": "str"}.get(self.kind, self.kind)
        return f"{text} or none" if self.optional else text
