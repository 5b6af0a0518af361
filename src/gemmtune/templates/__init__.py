"""Template registry: which templates exist and which are active for a problem."""

from __future__ import annotations

from typing import Sequence

from ..inputs import KernelInputs
from .base import Template
from .extern import AtenBiasAddmmTemplate, AtenTemplate, NumpyTemplate


def default_templates(experimental: bool = False, size: str = "default") -> list[Template]:
    """Every shipped template, extern first.  Templates not usable here report supports()=False.

    `experimental=True` adds the Hopper templates (`triton_splitk`, `triton_tma_persistent`):
    checked through the Triton interpreter but not yet run on an H200, so they are opt-in
    (`Settings(experimental_templates=True)`, `GEMMTUNE_EXPERIMENTAL_TEMPLATES=1`) until they are.
    """
    from .cpu_numba import NumbaMMTemplate
    from .triton_mm import TritonMMTemplate

    pool = [AtenTemplate("mm"), AtenTemplate("addmm"), AtenTemplate("bmm"), AtenBiasAddmmTemplate(),
            NumpyTemplate(), TritonMMTemplate(size=size)]
    if experimental:
        from .triton_splitk import TritonSplitKTemplate
        from .triton_tma import TritonTMAPersistentTemplate

        pool += [TritonSplitKTemplate(size=size), TritonTMAPersistentTemplate(size=size)]
    return pool + [NumbaMMTemplate()]


def active_templates(ki: KernelInputs, backends: Sequence[str] | None,
                     templates: Sequence[Template] | None = None, experimental: bool = False,
                     size: str = "default") -> list[Template]:
    """Templates of the requested families that can run `ki`.

    With `backends=None`, every family native to the device (GPU: extern + triton;
    CPU: extern + numba); a family named explicitly is used wherever it runs.
    """
    pool = default_templates(experimental, size) if templates is None else list(templates)

    def wanted(t: Template) -> bool:
        return ki.device_type in t.native_devices if backends is None else t.family in backends

    return [t for t in pool if wanted(t) and t.supports(ki)]


__all__ = ["Template", "default_templates", "active_templates"]
