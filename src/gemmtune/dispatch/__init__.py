"""Calls into tuned kernels: eager ops, torch.library ops and module patching.

`torch.ops.gemmtune.mm` / `addmm` / `bmm` (`dispatch.library`) are registered on import.  The traced
ops of `dispatch.compiled` (`torch.ops.gemmtune.traced_*`) are registered when a `torch.compile`
trace first meets a gemmtune GEMM, or on `import gemmtune.dispatch.compiled`: registering them loads
torch's compiler stack (`torch._dynamo`, about 1.5 s), which eager use never needs.
"""

from . import eager, library  # noqa: F401  library registers torch.ops.gemmtune.mm / addmm / bmm
from .eager import addmm, bmm, clear_dispatch_cache, dispatch_stats, mm
from .fp8 import scaled_mm
from .patching import patch, unpatch
from .warmup import WarmupReport, warmup

__all__ = ["addmm", "bmm", "clear_dispatch_cache", "dispatch_stats", "mm", "patch", "scaled_mm", "unpatch", "warmup",
           "WarmupReport"]


def _register_traced_ops() -> None:
    """Register `torch.ops.gemmtune.traced_*` (importing `dispatch.compiled` does)."""
    from . import compiled  # noqa: F401


eager.TRACED_OPS.append(_register_traced_ops)
