"""`gemmtune cache show NEEDLE`: each stored problem whose key contains NEEDLE, as a summary (the
problem, its pick and the pick's time, the fastest few timings); `--json`: every stored timing."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["show", "TOP", "WIDTH"]

TOP = 5
"""Timing rows shown per problem (the pick's row is added where it is not among them)."""
WIDTH = 100
"""The widest a summary is printed (a long choice wraps within it)."""


def show(store: Any, needle: str, out: Any, as_json: bool = False, top: int = TOP) -> int:
    """Print the problems of `store` matching `needle` on the console `out`; returns the exit status:
    0, or 1 (one line on stderr) when none matches.

    Example:
        >>> from rich.console import Console
        >>> from gemmtune.store.keys import Row
        >>> from gemmtune.store.sqlite import Store
        >>> s = Store(":memory:")
        >>> pick = Row("aten_mm", None, "{}", "{}", 0.25, "ok")
        >>> _ = s.save("env", {"device": "cpu"}, "mm(8x4, 4x2)/float32", "mm(8x4, 4x2)", [pick], pick, replace_pick=False)
        >>> show(s, "8x4", Console(width=80))  # doctest: +NORMALIZE_WHITESPACE
        mm(8x4, 4x2) on cpu: aten_mm, 0.2500 ms
          key mm(8x4, 4x2)/float32
          #   choice    ms       vs pick   status
          1   aten_mm   0.2500   1.00x     ok       <- pick
        0
    """
    found = store.show(needle)
    if not found:
        what = (f"no stored problem matches {needle!r} in {store.path}" if needle
                else f"the store {store.path} holds no picks")
        sys.stderr.write(f"gemmtune: {what}\n")
        sys.stderr.flush()
        return 1
    if as_json:
        out.print_json(data=found)
        return 0
    width = min(out.width, WIDTH)
    for i, p in enumerate(found):
        if i:
            out.print()
        _summary(p, out, width, top)
    return 0


def _label(template: str, config: dict, runtime: dict) -> str:
    cfg = ",".join(f"{k}={v}" for k, v in config.items())
    rt = " ".join(f"{k}={v}" for k, v in runtime.items())
    return " ".join(part for part in (template, cfg, rt) if part)


def _summary(p: dict[str, Any], out: Any, width: int, top: int) -> None:
    """One problem: a header (problem, device, pick, time), its key, and its fastest `top` timings (the
    pick's row marked; "vs pick" is each time over the pick's own row's)."""
    from rich.table import Table

    pick = (p["template"], p["config"], p["runtime_params"])
    ms = f"{p['ms']:.4f} ms" if p["ms"] is not None else "not timed"
    device = p["env_info"].get("device") or "unknown device"
    out.print(f"{p['describe'] or p['problem']} on {device}: {_label(*pick)}, {ms}", markup=False, highlight=False)
    out.print(f"  key {p['problem']}", markup=False, highlight=False, overflow="fold", width=width)
    rows = list(enumerate(p["choices"], 1))
    shown = rows[:top] + [(n, c) for n, c in rows[top:] if (c["template"], c["config"], c["runtime_params"]) == pick]
    base = next((c["ms"] for _, c in rows if (c["template"], c["config"], c["runtime_params"]) == pick), p["ms"])
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, justify in (("#", "right"), ("choice", "left"), ("ms", "right"), ("vs pick", "right"),
                         ("status", "left"), ("", "left")):
        table.add_column(col, justify=justify, overflow="fold", no_wrap=col != "choice")  # type: ignore[arg-type]
    for n, c in shown:
        mine = (c["template"], c["config"], c["runtime_params"]) == pick
        ratio = f"{c['ms'] / base:.2f}x" if c["ms"] and base else "-"
        table.add_row(str(n), _label(c["template"], c["config"], c["runtime_params"]),
                      f"{c['ms']:.4f}" if c["ms"] is not None else "-", ratio, c["status"], "<- pick" if mine else "")
    out.print(table, width=width)
    if len(shown) < len(rows):
        out.print(f"  {len(shown)} of {len(rows)} timings shown; --json for all", highlight=False)
