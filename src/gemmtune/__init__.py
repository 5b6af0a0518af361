"""gemmtune: a GEMM autotuner for PyTorch.

Example:
    >>> import torch, gemmtune
    >>> sel = gemmtune.tune("mm", torch.randn(64, 32), torch.randn(32, 16))
    >>> print(gemmtune.autotune_table(sel))  # doctest: +SKIP
"""

import os as _os

# A benchmark worker (gemmtune.bench.worker, a fresh interpreter) needs only the layers below the
# dispatch: it skips the public API's imports (torch.compile's machinery among them), which would
# add seconds to every worker start.
if _os.environ.get("GEMMTUNE_WORKER_PROCESS") != "1":
    from .core.choices import Choice, Selection, Timing
    from .core.errors import (BackendError, GemmtuneError, InductorUnavailable, InputError, IsolationUnavailable,
                              LayoutError, NoCandidatesError)
    from .templates.heuristics import add_finalize_hook, get_template_configs
    from .core.inputs import KernelInputs
    from .core.validate import ProblemTooLargeError
    from .core.layout import FixedLayout, FlexibleLayout
    from .report import autotune_table, selection_dict
    from .core.settings import FAMILIES, Settings
    from .engine import tune
    from .dispatch import WarmupReport, addmm, bmm, clear_dispatch_cache, dispatch_stats, mm, patch, unpatch, warmup
    from .dispatch import route as _route

    def _inductor_handler() -> bool:
        """A gemmtune GEMM traced for Inductor: make sure Inductor builds gemmtune's picks."""
        from .inductor.installer import ensure_installed

        return ensure_installed()

    _route.HOOKS.append(_inductor_handler)

from .core.version import __version__

__all__ = [
    "BackendError", "Choice", "FAMILIES", "FixedLayout", "FlexibleLayout", "GemmtuneError", "InductorUnavailable", "InputError",
    "IsolationUnavailable", "KernelInputs", "LayoutError", "NoCandidatesError", "ProblemTooLargeError", "Selection", "Settings", "Timing",
    "add_finalize_hook", "autotune_table", "get_template_configs", "selection_dict", "tune",
    "addmm", "bmm", "clear_dispatch_cache", "dispatch_stats", "mm", "patch", "unpatch", "warmup", "WarmupReport",
]
