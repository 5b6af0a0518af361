"""gemmtune: a GEMM autotuner for PyTorch.

Example:
    >>> import torch, gemmtune
    >>> sel = gemmtune.tune("mm", torch.randn(64, 32), torch.randn(32, 16))
    >>> print(gemmtune.autotune_table(sel))  # doctest: +SKIP
"""

from .choices import Choice, Selection, Timing
from .errors import BackendError, GemmtuneError, InputError, IsolationUnavailable, LayoutError, NoCandidatesError
from .heuristics import add_finalize_hook, get_template_configs
from .inputs import KernelInputs
from .validate import ProblemTooLargeError
from .layout import FixedLayout, FlexibleLayout
from .report import autotune_table, selection_dict
from .settings import FAMILIES, Settings
from .engine import tune
from .api import addmm, bmm, clear_dispatch_cache, dispatch_stats, mm
from .patching import patch, unpatch

__version__ = "0.1.0"

__all__ = [
    "BackendError", "Choice", "FAMILIES", "FixedLayout", "FlexibleLayout", "GemmtuneError", "InputError",
    "IsolationUnavailable", "KernelInputs", "LayoutError", "NoCandidatesError", "ProblemTooLargeError", "Selection", "Settings", "Timing",
    "add_finalize_hook", "autotune_table", "get_template_configs", "selection_dict", "tune",
    "addmm", "bmm", "clear_dispatch_cache", "dispatch_stats", "mm", "patch", "unpatch",
]
