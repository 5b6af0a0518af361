"""Stored rows checked against gemmtune's shipped templates (`gemmtune cache check`): a template gemmtune
ships, or a row Inductor timed; a config and runtime params inside the template's space
(`store.schema._unbuildable`, as for lookup tables).

A tune never needs this check: it only ever matches stored rows against its own candidates
(`store.memory.recall`), so a row of another template or config is never used there.

Example:
    >>> from gemmtune.store.keys import Row
    >>> catalog_fault(Row("aten_mm", None, "{}", "{}", 1.0, "ok"), "mm(8x4, 4x2)/float32/0123456789abcdef") is None
    True
    >>> catalog_fault(Row("mine", None, "{}", "{}", 1.0, "ok"), "p")[:24]
    "template 'mine' is not o"
"""

from __future__ import annotations

import json
from typing import Any

from .entry import shown
from .keys import Row

__all__ = ["INDUCTOR_PREFIX", "catalog_fault"]

INDUCTOR_PREFIX = "inductor:"  # the template of a row Inductor timed (`inductor.timed.PREFIX`)


def catalog_fault(r: Row, problem: str) -> str | None:
    """Why gemmtune's shipped templates cannot build row `r` of `problem`: an unknown template
    (Inductor-timed rows aside), a config or runtime outside its space; else None."""
    from ..templates.padded import PREFIX
    from .schema import _unbuildable

    if r.template.startswith(INDUCTOR_PREFIX):
        return None
    template = _catalog().get(r.template.removeprefix(PREFIX))  # a padded twin has its inner template's space
    if template is None:
        return f"template {shown(r.template)} is not one gemmtune ships (a template of your own?)"
    pin = {"template": r.template, "config": json.loads(r.config), "runtime_params": json.loads(r.runtime)}
    return _unbuildable(template, pin, problem.split("|out=")[0])


_CATALOG: dict[str, Any] = {}


def _catalog() -> dict[str, Any]:
    if not _CATALOG:
        from ..templates import default_templates
        from ..templates.registry import optional_templates

        _CATALOG.update({t.uid: t for t in [*default_templates(hopper=True, preview=True), *optional_templates()]})
    return _CATALOG
