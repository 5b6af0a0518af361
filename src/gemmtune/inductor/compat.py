"""What the installed torch offers: Inductor's lookup table and the templates gemmtune maps onto.

`torch._inductor.lookup_table` (the `LookupTableChoices` handler and `config.lookup_table`) is in
torch builds from late 2025 on; without it every entry point raises `InductorUnavailable` with the
torch version, never an ImportError from deep inside Inductor.

Example:
    >>> available() in (True, False)
    True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..core.errors import InductorUnavailable

__all__ = ["available", "require", "InductorTemplates", "inductor_templates", "HOOKS"]

HOOKS = ("make_lookup_key", "_get_device_key", "_get_lookup_table", "_finalize_template_configs", "_fallback",
         "get_ktc")
"""The LookupTableChoices / InductorChoices methods gemmtune.inductor calls or overrides."""


def require() -> Any:
    """The installed torch's `LookupTableChoices` class; InductorUnavailable when torch has none.

    Example:
        >>> require().__name__ if available() else "LookupTableChoices"
        'LookupTableChoices'
    """
    try:
        from torch._inductor import config
        from torch._inductor.lookup_table import LookupTableChoices
    except Exception as exc:  # noqa: BLE001 - an older torch, or an Inductor that fails to import
        raise InductorUnavailable(
            f"torch {torch.__version__} has no Inductor lookup table (torch._inductor.lookup_table: "
            f"{type(exc).__name__}: {exc}); gemmtune.inductor needs a torch with it (see docs/MODELS.md)") from exc
    missing = [name for name in HOOKS if not hasattr(LookupTableChoices, name)]
    if not hasattr(config, "lookup_table") or missing:
        raise InductorUnavailable(f"torch {torch.__version__}: its Inductor lookup table lacks "
                                  f"{', '.join(missing) or 'config.lookup_table'}, which gemmtune.inductor uses "
                                  "(an early form of the lookup table; see docs/MODELS.md)")
    return LookupTableChoices


def available() -> bool:
    """Whether the installed torch has the lookup table gemmtune feeds."""
    try:
        require()
    except InductorUnavailable:
        return False
    return True


@dataclass(frozen=True)
class InductorTemplates:
    """The uids and source hashes of the Inductor templates gemmtune's picks map onto."""

    aten: dict  # op ("mm", "addmm", "bmm", "bias_addmm", "scaled_mm": aten._scaled_mm) -> uid
    triton_mm: str
    triton_bmm: str
    tma: str | None  # None: this torch has no such template (its picks then map as "closest")
    decompose_k: str | None
    hashes: dict  # uid -> src_hash (None for library kernels)

    def hash_of(self, uid: str) -> str | None:
        return self.hashes.get(uid)


@functools.lru_cache(maxsize=1)
def inductor_templates() -> InductorTemplates:
    """Read from the installed torch (`template.uid`, `template.src_hash`), never spelled out here.

    Example:
        >>> inductor_templates().aten["mm"] if available() else "aten::mm"
        'aten::mm'
    """
    require()
    from torch._inductor.kernel import bmm, mm

    def uid(module: Any, name: str) -> Any:  # a template this torch lacks maps to nothing (None)
        return getattr(getattr(module, name, None), "uid", None)

    objs = {"mm": mm.aten_mm, "addmm": mm.aten_addmm, "bias_addmm": getattr(mm, "aten_bias_addmm", None),
            "bmm": bmm.aten_bmm, "scaled_mm": getattr(mm, "aten__fp8_mm", None)}
    templates: list[Any] = [*objs.values(), getattr(mm, "mm_template", None), getattr(bmm, "bmm_template", None),
                            getattr(mm, "persistent_tma_mm_template", None),
                            getattr(mm, "decompose_k_subgraph_template", None)]
    return InductorTemplates(
        aten={op: t.uid for op, t in objs.items() if t is not None}, triton_mm=uid(mm, "mm_template"),
        triton_bmm=uid(bmm, "bmm_template"), tma=uid(mm, "persistent_tma_mm_template"),
        decompose_k=uid(mm, "decompose_k_subgraph_template"),
        hashes={t.uid: getattr(t, "src_hash", None) for t in templates if t is not None})
