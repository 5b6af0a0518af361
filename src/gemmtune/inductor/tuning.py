"""A miss inside Inductor: tune the problem with gemmtune on stand-in tensors, return its entries.

The stand-ins have the kernel inputs' sizes, strides (broadcast dims included), dtypes and device
and random data; tuning runs real kernels, so it leaves Inductor's fake-tensor mode first.  By
default only templates whose pick Inductor can build exactly take part (`templates="inductor"`:
the library kernels, `triton_mm`, `triton_tma_persistent`); `templates="all"` lets every gemmtune
template compete and exports the closest Inductor choices when another one wins.  Picks are stored
under their own key (`store_tag="inductor"`), so a warm store answers without timing anything.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..core.inputs import KernelInputs, stand_in
from ..core.settings import Settings
from ..templates import INDUCTOR_TEMPLATES, default_templates
from ..templates import inductor_pool as buildable_pool
from .entries import FUSION, InductorPick, entries_for
from .extern import EXTERN_UID, register
from .keys import problem_keys

__all__ = ["EXACT_TEMPLATES", "inductor_pool", "tune_inductor_problem", "pick_for_selection", "scalars_of",
           "settings_text"]

EXACT_TEMPLATES = INDUCTOR_TEMPLATES


def pick_for_selection(sel: Any, few: int = 2, fusion: int | str = FUSION, extern: tuple[str, ...] = ()) -> InductorPick:
    """The Inductor entries of a gemmtune Selection (from `gemmtune.tune`), under every key of its problem;
    a pick of a template in `extern` is handed over as gemmtune's kernel (`inductor.extern`), kept here.

    Example:
        >>> import gemmtune
        >>> sel = gemmtune.tune("mm", torch.randn(16, 8), torch.randn(8, 4), backends=("extern",),
        ...                     settings=gemmtune.Settings(store="off"))
        >>> pick_for_selection(sel).op  # doctest: +SKIP
        'mm'
    """
    ki: KernelInputs = sel.problem
    measured = [t for t in sel.timings if t.status == "ok"]
    pick = entries_for(ki, sel.winner, measured, few=few, keys=problem_keys(ki), fusion=fusion, extern=extern)
    first = pick.entries[0] if pick.entries else {}
    if first.get("template_id") == EXTERN_UID and sel.kernel is not None:
        register(str(first["pick"]), ki.operands, sel.kernel)
    return pick


def inductor_pool(device_type: str, templates: str, settings: Settings) -> list:
    """The gemmtune templates that compete for an Inductor problem (`templates`: "inductor" or "all")."""
    if templates == "all":
        return default_templates(settings.hopper_templates, settings.config_space, settings.preview_templates)
    return buildable_pool(device_type, settings)


def gemmtune_inputs(kernel_inputs: Any, op_name: str) -> KernelInputs | None:
    """Inductor's kernel inputs as gemmtune's problem description; None when a size is symbolic."""
    from ..core.inputs import TensorMeta, device_str

    shapes, strides = kernel_inputs.shapes_hinted(), kernel_inputs.strides_hinted()
    if not all(isinstance(s, int) for dims in (*shapes, *strides) for s in dims):
        return None
    dev = device_str(kernel_inputs.device())
    metas = tuple(TensorMeta(tuple(sz), tuple(st), dt, dev)
                  for sz, st, dt in zip(shapes, strides, kernel_inputs.dtypes()))
    return KernelInputs(op_name, metas, *scalars_of(kernel_inputs))


def scalars_of(kernel_inputs: Any) -> tuple[float, float]:
    """(alpha, beta) of Inductor's kernel inputs (1.0 where unset)."""
    scalars = dict(getattr(kernel_inputs, "_scalars", {}) or {})
    return float(scalars.get("alpha", 1.0)), float(scalars.get("beta", 1.0))


def tune_inductor_problem(kernel_inputs: Any, op_name: str, settings: Settings | None,
                          templates: str = "inductor", fusion: int | str = FUSION,
                          extern: tuple[str, ...] = ()) -> tuple[InductorPick, bool] | None:
    """Tune the problem behind Inductor's `kernel_inputs`: (its entries, whether the store answered);
    None when its sizes are not plain ints."""
    ki = gemmtune_inputs(kernel_inputs, op_name)
    if ki is None:
        return None
    settings = settings or Settings.from_env()
    from ..engine import tune

    device = kernel_inputs.device()
    with _disable_current_modes(), torch.no_grad():
        tensors = [stand_in(m.size, m.stride, m.dtype, device) for m in ki.operands]
        pool = inductor_pool(device.type, templates, settings)
        sel = tune(op_name, *tensors, settings=settings, templates=pool, store_tag="inductor",
                   alpha=ki.alpha, beta=ki.beta)
    return pick_for_selection(sel, fusion=fusion, extern=extern), bool(sel.cache_hit)


def settings_text(settings: Settings | None) -> str:
    """`settings` (None: the environment's) as text for a cache key; a bad `GEMMTUNE_*` variable fails the
    tunes, not the key (nor, through it, every compile).

    Example:
        >>> settings_text(Settings(store="off")) == repr(Settings(store="off"))
        True
    """
    try:
        return repr(settings or Settings.from_env())
    except Exception as exc:  # noqa: BLE001 - the tunes report it
        return f"settings unreadable: {type(exc).__name__}"
