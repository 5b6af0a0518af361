"""The template registry: which templates exist and which are active for a problem.

Example:
    >>> [t.uid for t in default_templates(hopper=False)][:2]
    ['aten_mm', 'aten_addmm']
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core.inputs import KernelInputs
from .base import Template
from .extern import AtenBiasAddmmTemplate, AtenScaledMMTemplate, AtenTemplate, NumpyTemplate
from .padded import padded_pool


def _scaled_tma(size: str = "default") -> Template:
    from .triton.scaled_tma import TritonScaledTMATemplate

    return TritonScaledTMATemplate(size=size)


PREVIEW_TEMPLATES: tuple = (_scaled_tma,)
"""Factories (`size=` -> Template) of the templates not yet proven on a GPU, added by `preview=True`:
`triton_scaled_tma` (fp8, persistent TMA; docs/FP8.md).  `triton_gemv` graduated after its H200
measurements (docs/ARCHITECTURE.md)."""


def default_templates(hopper: bool = True, size: str = "default", preview: bool = False) -> list[Template]:
    """Every shipped template, extern first.  Templates not usable here report supports()=False.
    `triton_scaled_mm` (fp8, compute capability >= 8.9) serves the scaled_mm op only.

    `hopper=True` (the default; `Settings(hopper_templates=False)` or `GEMMTUNE_HOPPER_TEMPLATES=0`
    turns it off) adds `triton_splitk` (offered for small M*N with a deep K), `triton_skinny`
    (one-launch split-K, M <= 256), `triton_gemv` (M <= 4) and `triton_tma_persistent` (compute
    capability >= 9) and, where a Hopper GPU is present, `cutlass_operators` (with
    nvidia-cutlass-operators, `gemmtune[cutlass]`): pooled where `backends` names "cutlass" and, with
    `backends` unset, for problems of 2048 or more in every dimension; skipped with one log line otherwise.  `preview=True`
    (`Settings(preview_templates=True)`, `GEMMTUNE_PREVIEW_TEMPLATES=1`)
    adds the templates of `PREVIEW_TEMPLATES`, those not yet proven on a GPU (`triton_scaled_tma`).

    Example:
        >>> [t.uid for t in default_templates(hopper=False)][-2:]
        ['triton_mm', 'numba_mm']
    """
    from .cpu_numba import NumbaMMTemplate
    from .triton.mm import TritonMMTemplate
    from .triton.scaled_mm import TritonScaledMMTemplate

    pool = [AtenTemplate("mm"), AtenTemplate("addmm"), AtenTemplate("bmm"), AtenBiasAddmmTemplate(),
            AtenScaledMMTemplate(), NumpyTemplate(), TritonScaledMMTemplate(size=size), TritonMMTemplate(size=size)]
    if hopper:
        from .triton.gemv import TritonGemvTemplate
        from .triton.skinny import TritonSkinnyTemplate
        from .triton.splitk import TritonSplitKTemplate
        from .triton.tma import TritonTMAPersistentTemplate

        pool += [TritonSplitKTemplate(size=size), TritonSkinnyTemplate(size=size), TritonGemvTemplate(size=size),
                 TritonTMAPersistentTemplate(size=size)]
    if preview:
        pool += [factory(size=size) for factory in PREVIEW_TEMPLATES]
    if hopper:  # an optional template not usable here is skipped, with one log line (its `unavailable()`)
        pool += [t for t in optional_templates(size) if t.unavailable() is None]
    return pool + [NumbaMMTemplate()]


def optional_templates(size: str = "default") -> list[Template]:
    """The shipped templates that join the pool only where they can run (`Template.unavailable()` None):
    `cutlass_operators` (nvidia-cutlass-operators and a Hopper GPU), the `cutlass` family.

    Example:
        >>> [t.uid for t in optional_templates()]
        ['cutlass_operators']
    """
    from .cutlass import CutlassOperatorsTemplate

    return [CutlassOperatorsTemplate(size=size)]


def active_templates(ki: KernelInputs, backends: Sequence[str] | None,
                     templates: Sequence[Template] | None = None, hopper: bool = True,
                     size: str = "default", preview: bool = False) -> list[Template]:
    """Templates of the requested families that can run `ki` (those whose `ops` name its op).

    With `backends=None`, every family native to the device (GPU: extern + triton, and on Hopper
    `cutlass_operators` for problems of 2048 and more in every dimension; CPU: extern + numba), less an
    opt-in template (`Template.opt_in`: NumPy's BLAS) unless `templates` lists it, and less a template
    whose `default_min_dim` the problem is under; a family named explicitly is used wherever it runs.
    On a GPU, with `templates` None, a problem with a misaligned leading dimension also gets each
    active template's padded twin (`templates.padded`).
    """
    pool = default_templates(hopper, size, preview) if templates is None else list(templates)
    smallest = min(ki.M, ki.N, ki.K)

    def wanted(t: Template) -> bool:
        if backends is None:
            return (ki.device_type in t.native_devices and (templates is not None or not t.opt_in)
                    and smallest >= t.default_min_dim)
        return t.family in backends

    active = [t for t in pool if ki.op in t.ops and wanted(t) and t.supports(ki)]
    if templates is None and ki.device_type == "cuda":  # a misaligned problem: each template's padded twin too
        active += padded_pool(ki, pool, wanted)
    return active



def skipped_note(backends: Sequence[str] | None) -> str:
    """Why the optional templates of a family named in `backends` are not in the pool here, as
    "; <template>: <why>" for an error message; empty when none was left out.

    Example:
        >>> skipped_note(None), skipped_note(("extern",))
        ('', '')
    """
    if not backends:
        return ""
    reasons = [(t.uid, t.unavailable()) for t in optional_templates() if t.family in backends]
    return "".join(f"; {uid}: {why}" for uid, why in reasons if why)


INDUCTOR_TEMPLATES = ("aten_mm", "aten_addmm", "aten_bmm", "triton_mm", "triton_tma_persistent")
"""The templates whose picks Inductor builds exactly (its aten kernels and Triton templates)."""


def inductor_pool(device_type: str, settings: Any) -> list:
    """The templates that compete for a problem Inductor will build (library kernels only off the GPU):
    `settings` is a `Settings`.

    Example:
        >>> from gemmtune.core.settings import Settings
        >>> [t.uid for t in inductor_pool("cpu", Settings())]
        ['aten_mm', 'aten_addmm', 'aten_bmm']
    """
    keep = INDUCTOR_TEMPLATES if device_type == "cuda" else INDUCTOR_TEMPLATES[:3]
    return [t for t in settings_pool(settings) if t.uid in keep]


def settings_pool(settings: Any) -> list:
    """The shipped pool as `settings` (a `Settings`) shapes it: its Hopper templates, config space and
    preview templates.

    Example:
        >>> from gemmtune.core.settings import Settings
        >>> "aten_scaled_mm" in [t.uid for t in settings_pool(Settings())]
        True
    """
    return default_templates(settings.hopper_templates, settings.config_space, settings.preview_templates)
