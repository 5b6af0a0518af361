"""Templates: the plug-ins that turn a problem into candidate kernels (`base.Template`).

`registry` says which templates exist and which are active for a problem; `heuristics` asks
every active one for its candidates; `extern` holds the library kernels, `cpu_numba` the Numba
CPU template and `triton/` the Triton templates.  This package only re-exports.

Example:
    >>> from gemmtune.templates import default_templates
    >>> "triton_mm" in [t.uid for t in default_templates()]
    True
"""

from .base import Template
from .registry import INDUCTOR_TEMPLATES, PREVIEW_TEMPLATES, active_templates, default_templates, inductor_pool, skipped_note

__all__ = ["Template", "INDUCTOR_TEMPLATES", "PREVIEW_TEMPLATES", "default_templates", "active_templates",
           "inductor_pool", "skipped_note"]
