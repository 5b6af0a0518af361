"""`gemmtune cache ls`' second table: the problem families stored at several M (the buckets a range
warm-up tuned, `dispatch.buckets`), with each bucket's pick.

Example:
    >>> rows = families([{"problem": "mm(4x64, 64x32)/float32/ab|out=row", "template": "aten_mm"},
    ...                  {"problem": "mm(8x64, 64x32)/float32/cd|out=row", "template": "triton_mm"}])
    >>> rows
    [('mm(Mx64, 64x32) float32 out=row', [(4, 'aten_mm'), (8, 'triton_mm')])]
"""

from __future__ import annotations

import re
from typing import Any, Sequence

__all__ = ["families", "family_table"]

_GEMM = re.compile(r"^(mm|addmm)\((?:([^,()]+), )?(\d+)x(\d+), (\d+)x(\d+)\)$")


def families(problems: Sequence[dict[str, Any]]) -> list[tuple[str, list[tuple[int, str]]]]:
    """The mm / addmm families stored at two or more M: (family, [(M, pick's template)]), M ascending.
    A family is a problem's description with M left out, its dtype and output layout."""
    found: dict[str, dict[int, str]] = {}
    for p in problems:
        describe, _, rest = p["problem"].partition("/")
        match = _GEMM.match(describe)
        if match is None:
            continue
        op, bias, m, k, k2, n = match.groups()
        dtype = rest.split("/")[0]
        out = rest.rpartition("|")[2] if "|" in rest else ""
        name = f"{op}({bias + ', ' if bias else ''}Mx{k}, {k2}x{n}) {dtype} {out}".strip()
        found.setdefault(name, {})[int(m)] = p["template"]
    return [(name, sorted(ms.items())) for name, ms in sorted(found.items()) if len(ms) > 1]


def family_table(problems: Sequence[dict[str, Any]]) -> Any:
    """A rich Table of `families(problems)`, or None where no family is stored at several M."""
    from rich.table import Table

    rows = families(problems)
    if not rows:
        return None
    table = Table(title="problems stored at several M (gemmtune.warmup(..., m=), tune --m): the pick per M")
    for col in ("family", "M", "picks"):
        table.add_column(col, overflow="fold")
    for name, picks in rows:
        ms = ", ".join(str(m) for m, _ in picks)
        table.add_row(name, ms, ", ".join(f"{m}: {uid}" for m, uid in picks))
    return table
