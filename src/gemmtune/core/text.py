"""Text that fits its reader: one width rule for every command's output, prose wrapped to it.

The rule: at most `MAX_WIDTH` (100) columns.  `COLUMNS`, when set, is honoured (a terminal's
width, or a narrower one asked for), else a terminal's own width; output that is not a terminal
(a pipe, a file) gets `MAX_WIDTH`.  Prose wraps between words, so a number is never cut (only a
word longer than a whole line, a long path, folds).
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import IO, Iterable, Mapping, Sequence

__all__ = ["MAX_WIDTH", "output_width", "wrap", "fit", "columns"]

MAX_WIDTH = 100
MIN_WIDTH = 40  # narrower than this, nothing fits anyway: the terminal wraps what is longer


def output_width(stream: IO[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Columns for text written to `stream` (default `sys.stdout`): `COLUMNS` of `environ` (default
    `os.environ`) when set, else the terminal's width, capped at `MAX_WIDTH`; `MAX_WIDTH` when `stream`
    is not a terminal.

    Example:
        >>> import io
        >>> output_width(io.StringIO(), {}), output_width(io.StringIO(), {"COLUMNS": "80"})
        (100, 80)
        >>> output_width(io.StringIO(), {"COLUMNS": "300"})
        100
    """
    stream = sys.stdout if stream is None else stream
    asked = (os.environ if environ is None else environ).get("COLUMNS", "").strip()
    if asked.isdigit() and int(asked) > 0:
        return max(MIN_WIDTH, min(int(asked), MAX_WIDTH))
    try:
        if stream.isatty():
            return max(MIN_WIDTH, min(os.get_terminal_size(stream.fileno()).columns, MAX_WIDTH))
    except (AttributeError, OSError, ValueError):  # no file descriptor (a StringIO), or a closed one
        pass
    return MAX_WIDTH


def wrap(line: str, width: int, indent: str | None = None) -> list[str]:
    """`line` cut between words into lines of at most `width` columns (a word longer than a whole line,
    a long path, folds); continuation lines start with `indent` (default: the line's own indent and
    two spaces).

    Example:
        >>> wrap("note: a fairly long note about 12.5 ms", 20)
        ['note: a fairly long', '  note about 12.5 ms']
        >>> wrap("  short", 20), wrap("  a row of words", 10)
        (['  short'], ['  a row of', '    words'])
    """
    if len(line) <= width:
        return [line]
    lead = line[: len(line) - len(line.lstrip(" "))]
    indent = lead + "  " if indent is None else indent
    return textwrap.wrap(line.lstrip(" "), width, initial_indent=lead, subsequent_indent=indent, break_long_words=True,
                         break_on_hyphens=False) or [line]


def fit(lines: Iterable[str], width: int) -> list[str]:
    """Every line of `lines` wrapped to `width` (`wrap`).

    Example:
        >>> fit(["one two three", "four"], 9)
        ['one two', '  three', 'four']
    """
    return [part for line in lines for text in line.split("\n") for part in wrap(text, width)]


def columns(header: Sequence[str], rows: Sequence[Sequence[str]], width: int, right: Iterable[int] = ()) -> list[str]:
    """A plain-text table: each column as wide as its widest cell, one space apart, columns in `right`
    right-aligned.  Where a row would pass `width`, its last cell goes on the next line, indented by 4
    (and wraps there, `wrap`); no other cell is ever cut.

    Example:
        >>> for line in columns(["name", "ms", "winner"], [["a", "1.50", "x"], ["bb", "10.25", "y" * 14]], 20, [1]):
        ...     print(line)
        name    ms winner
        a     1.50 x
        bb   10.25
            yyyyyyyyyyyyyy
    """
    right = set(right)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        line = " ".join(cells).rstrip()
        if len(line) <= width:
            out.append(line)
        else:
            out += wrap(" ".join(cells[:-1]).rstrip(), width) + wrap("    " + str(row[-1]), width)
    return out
