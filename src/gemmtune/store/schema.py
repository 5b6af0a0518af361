"""The checks of lookup tables and `gemmtune cache export` files, run completely when they are loaded.

A pin is `{"template": str, "src_hash": str|None, "config": {...}, "runtime_params": {...}}`
(`config`, `runtime_params`, `src_hash` optional).  A lookup table is `{problem_key: [pins]}` or an
export file; an export file is `{"format": EXPORT_FORMAT, "entries": [{problem, pick, timings,
env}]}`.  Anything else is a `LookupTableError` naming the file, the entry and the fault.  A pin
naming a template gemmtune does not ship is a warning (it can never match a candidate).

Example:
    >>> check_table({"mm(8x4, 4x2)/float32/abc": [{"template": "aten_mm"}]}, "t.json")
    {'mm(8x4, 4x2)/float32/abc': [{'template': 'aten_mm'}]}
    >>> check_table({"p": ["aten_mm"]}, "t.json")
    Traceback (most recent call last):
    ...
    gemmtune.core.errors.LookupTableError: t.json: entry 'p' pin 0: a pin must be an object with a 'template', got str
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Mapping

from ..core.errors import LookupTableError

__all__ = ["check_pin", "check_table", "check_export", "unknown_templates"]

from .marker import EXPORT_FORMAT

_TIMING_KEYS = ("template", "config", "runtime_params", "status")


def check_pin(pin: Any, where: str) -> None:
    """Raise LookupTableError unless `pin` is a well-formed pinned choice."""
    if not isinstance(pin, Mapping):
        raise LookupTableError(f"{where}: a pin must be an object with a 'template', got {type(pin).__name__}")
    if not isinstance(pin.get("template"), str) or not pin["template"]:
        raise LookupTableError(f"{where}: 'template' must be a template name, got {pin.get('template')!r}")
    for field in ("config", "runtime_params"):
        if field in pin and not isinstance(pin[field], Mapping):
            raise LookupTableError(f"{where}: {field!r} must be an object, got {type(pin[field]).__name__}")
    if pin.get("src_hash") is not None and not isinstance(pin["src_hash"], str):
        raise LookupTableError(f"{where}: 'src_hash' must be a string or null, got {pin['src_hash']!r}")
    if "ms" in pin and pin["ms"] is not None and not isinstance(pin["ms"], (int, float)):
        raise LookupTableError(f"{where}: 'ms' must be a number or null, got {pin['ms']!r}")


def check_table(data: Any, source: str) -> dict[str, list]:
    """`{problem: [pins]}` from a lookup table or an export file (checked completely)."""
    if isinstance(data, Mapping) and data.get("format") == EXPORT_FORMAT:
        check_export(data, source, need_env=False)
        return {e["problem"]: [e["pick"]] for e in data["entries"]}
    if not isinstance(data, Mapping):
        raise LookupTableError(f"{source}: expected {{problem_key: [pins]}} or a `gemmtune cache export` file, "
                               f"got {type(data).__name__}")
    if "entries" in data or "format" in data:
        raise LookupTableError(f"{source}: 'format' must be {EXPORT_FORMAT!r} for an export file, "
                               f"got {data.get('format')!r}")
    for problem, pins in data.items():
        if not isinstance(pins, list):
            raise LookupTableError(f"{source}: entry {problem!r}: expected a list of pins, got {type(pins).__name__}")
        for i, pin in enumerate(pins):
            check_pin(pin, f"{source}: entry {problem!r} pin {i}")
    return dict(data)


def check_export(data: Any, source: str, need_env: bool) -> None:
    """Raise LookupTableError unless `data` is a complete `gemmtune cache export` file."""
    if not isinstance(data, Mapping) or data.get("format") != EXPORT_FORMAT:
        raise LookupTableError(f"{source}: not a gemmtune export (expected format {EXPORT_FORMAT!r})")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise LookupTableError(f"{source}: 'entries' must be a list, got {type(entries).__name__}")
    for i, e in enumerate(entries):
        where = f"{source}: entry {i}"
        if not isinstance(e, Mapping) or not isinstance(e.get("problem"), str):
            raise LookupTableError(f"{where}: must be an object with a 'problem' key string")
        where = f"{source}: entry {i} ({e['problem']})"
        if "pick" not in e:
            raise LookupTableError(f"{where}: no 'pick'")
        check_pin(e["pick"], f"{where} pick")
        if need_env and not isinstance(e.get("env"), Mapping):
            raise LookupTableError(f"{where}: 'env' must be an object (the environment it was measured in)")
        timings = e.get("timings", [] if not need_env else None)
        if not isinstance(timings, list):
            raise LookupTableError(f"{where}: 'timings' must be a list")
        for j, t in enumerate(timings):
            check_pin(t, f"{where} timing {j}")
            if not isinstance(t.get("status"), str) and need_env:
                raise LookupTableError(f"{where} timing {j}: 'status' must be a string")


PROBLEM_KEY = re.compile(r"(mm|addmm|bmm)\(((\d+(x\d+)*|scalar)(, (\d+(x\d+)*|scalar))*)\)/\w+/[0-9a-f]{16}")
"""The form of `KernelInputs.problem_key` (as `gemmtune cache ls` prints it): op(sizes)/dtype/digest."""


def unknown_templates(table: Mapping[str, list], source: str, strict: bool = False) -> list[str]:
    """Warn about entries and pins that can never match a candidate; returns the warnings (`strict`:
    raise the first as a LookupTableError instead, as `gemmtune cache import` does).

    A key that is not a problem key, a key with no pins, a template gemmtune does not ship (once per
    template), a template of another op, and a config or runtime value its template cannot build: a
    config on a library kernel (they have one empty config), a config value that is not a number, a
    numba_mm config that is not one of the problem's candidates, a runtime parameter the template does
    not have or a value outside its runtime space.
    """
    from ..templates import default_templates
    from ..templates.registry import optional_templates

    shipped = [*default_templates(hopper=True, preview=True), *optional_templates()]  # usable here or not
    templates = {t.uid: t for t in shipped}
    out = []
    for problem, pins in table.items():
        base = problem.split("|out=")[0]
        if not PROBLEM_KEY.fullmatch(base):
            out.append(f"{source}: key {problem!r} is not a problem key (op(sizes)/dtype/digest, as "
                       "`gemmtune cache ls` prints it)")
        elif not pins:
            out.append(f"{source}: key {problem!r} has no pins")
    for name in sorted({p["template"] for pins in table.values() for p in pins} - set(templates)):
        problems = [k for k, pins in table.items() if any(p["template"] == name for p in pins)]
        out.append(f"{source}: pin of {problems[0]!r}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1
                   else "") + f" names unknown template {name!r} (known: {', '.join(sorted(templates))})")
    for problem, pins in table.items():
        for pin in pins:
            why = _unbuildable(templates.get(pin["template"]), pin, problem.split("|out=")[0])
            if why:
                out.append(f"{source}: pin of {problem!r} ({pin['template']}): {why}")
    if strict and out:
        raise LookupTableError(f"{out[0]}; it would never match a candidate")
    for msg in out:
        warnings.warn(f"gemmtune: {msg}; it will never match a candidate", RuntimeWarning, stacklevel=3)
    return out


def _unbuildable(template: Any, pin: Mapping[str, Any], problem: str) -> str | None:
    """Why `template` cannot build `pin`'s config and runtime params for `problem` (None: it may;
    unknown templates: None)."""
    if template is None:
        return None
    match = PROBLEM_KEY.fullmatch(problem)
    op = getattr(template, "op", None)
    if match and op is not None and match.group(1) != op:
        return f"a template of {op}, not of {match.group(1)}"
    if template.is_extern and pin.get("config"):
        return f"a library kernel has no config, got {dict(pin['config'])}"
    config = dict(pin.get("config") or {})
    text = template.config_text_keys
    odd = {k: v for k, v in config.items()
           if not (k in text and isinstance(v, str)) and (isinstance(v, bool) or not isinstance(v, int))}
    if odd:
        names = f" (names for {', '.join(text)})" if text else ""
        return f"config values must be integers{names}, got {odd}"
    if match and template.uid == "numba_mm" and config:
        fitted = _numba_candidates(template, match)
        if fitted is not None and config not in fitted:
            return f"config {config} is not one of its candidates for this problem ({fitted})"
    for key, value in dict(pin.get("runtime_params") or {}).items():
        space = template.runtime_space.get(key)
        if space is None:
            return f"no runtime parameter {key!r} (has: {', '.join(sorted(template.runtime_space)) or 'none'})"
        if value not in space:
            return f"runtime parameter {key}={value!r} is outside {list(space)}"
    return None


def _numba_candidates(template: Any, match: re.Match) -> list[dict] | None:
    """numba_mm's configs for the problem of a key (its tiles depend on M, N and K only)."""
    sizes = [[int(d) for d in part.split("x")] for part in match.group(2).split(", ") if part != "scalar"]
    mats = sizes[-2:]
    if len(mats) != 2 or len(mats[0]) < 2 or len(mats[1]) < 2:
        return None
    (m, k), n = mats[0][-2:], mats[1][-1]
    from ..templates.cpu_numba import fit_configs

    return fit_configs(m, n, k, template.space)
