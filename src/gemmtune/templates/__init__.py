"""Template registry: which templates exist and which are active for a problem."""

from __future__ import annotations

from typing import Sequence

from ..inputs import KernelInputs
from .base import Template
from .extern import AtenBiasAddmmTemplate, AtenTemplate, NumpyTemplate


def default_templates() -> list[Template]:
    """Every shipped template, extern first.  Templates not usable here report supports()=False."""
    from .cpu_numba import NumbaMMTemplate
    from .triton_mm import TritonMMTemplate

    return [AtenTemplate("mm"), AtenTemplate("addmm"), AtenTemplate("bmm"), AtenBiasAddmmTemplate(),
            NumpyTemplate(), TritonMMTemplate(), NumbaMMTemplate()]


def active_templates(ki: KernelInputs, backends: Sequence[str] | None,
                     templates: Sequence[Template] | None = None) -> list[Template]:
    """Templates of the requested families that can run `ki`.

    With `backends=None`, every family native to the device (GPU: extern + triton;
    CPU: extern + numba); a family named explicitly is used wherever it runs.
    """
    pool = default_templates() if templates is None else list(templates)

    def wanted(t: Template) -> bool:
        return ki.device_type in t.native_devices if backends is None else t.family in backends

    return [t for t in pool if wanted(t) and t.supports(ki)]


__all__ = ["Template", "default_templates", "active_templates"]
