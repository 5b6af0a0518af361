"""Calls into tuned kernels: eager ops, torch.library ops (registered on import) and module patching."""

from . import compiled, library  # noqa: F401  registers torch.ops.gemmtune.*
from .eager import addmm, bmm, clear_dispatch_cache, dispatch_stats, mm
from .fp8 import scaled_mm
from .patching import patch, unpatch
from .warmup import WarmupReport, warmup

__all__ = ["addmm", "bmm", "clear_dispatch_cache", "dispatch_stats", "mm", "patch", "scaled_mm", "unpatch", "warmup",
           "WarmupReport"]
