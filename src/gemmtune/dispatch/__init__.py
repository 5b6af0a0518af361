"""Calls into tuned kernels: eager ops, torch.library ops and module patching.

The custom ops, `torch.ops.gemmtune.mm` / `addmm` / `bmm` (`dispatch.library`) and the traced ops
of `dispatch.compiled` (`torch.ops.gemmtune.traced_*`), are registered when a `torch.compile` trace
first meets a gemmtune GEMM, or on `import gemmtune.dispatch.library` (`.compiled`).  Eager use never
needs them: registering the traced ops loads torch's compiler stack (`torch._dynamo`, about 1.5 s),
and the three custom ops took 0.6 s of a warm-up on the H200.
"""

from . import eager
from .eager import addmm, bmm, clear_dispatch_cache, dispatch_stats, mm
from .fp8 import scaled_mm
from .patching import patch, unpatch
from .ranges import tune_buckets, tune_wanted_buckets
from .warmup import WarmupReport, warmup

__all__ = ["addmm", "bmm", "clear_dispatch_cache", "dispatch_stats", "mm", "patch", "scaled_mm", "tune_buckets",
           "tune_wanted_buckets", "unpatch", "warmup", "WarmupReport"]


def _register_traced_ops() -> None:
    """Register `torch.ops.gemmtune.traced_*` and the custom ops (importing `dispatch.compiled` does)."""
    from . import compiled  # noqa: F401


eager.TRACED_OPS.append(_register_traced_ops)
