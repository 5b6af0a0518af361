"""What the CUTLASS family needs to know about the CuTe DSL and the GPU, without importing the DSL.

Example:
    >>> installed_version("no-such-distribution-here") is None
    True
    >>> v = dsl_version(); v is None or v[0].isdigit()
    True
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

import torch

__all__ = ["DSL_DISTRIBUTION", "installed_version", "dsl_version", "dsl_importable", "hopper_gpu_reason",
           "ensure_cache_dir"]

DSL_DISTRIBUTION = "nvidia-cutlass-dsl"


def installed_version(distribution: str) -> str | None:
    """The installed version of a Python distribution, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def dsl_version() -> str | None:
    """The installed nvidia-cutlass-dsl version, or None when it is not installed."""
    return installed_version(DSL_DISTRIBUTION)


def dsl_importable() -> bool:
    """Whether `import cutlass.cute` would find the DSL (nothing is imported here)."""
    try:
        return importlib.util.find_spec("cutlass") is not None and dsl_version() is not None
    except (ImportError, ValueError):
        return False


def hopper_gpu_reason() -> str | None:
    """None when a CUDA device of compute capability >= 9.0 is present, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    return None if major >= 9 else f"compute capability {major}.{minor} < 9.0"


def ensure_cache_dir() -> None:
    """Point the DSL's cache directory at gemmtune's cache (unless CUTE_DSL_CACHE_DIR is set).  It holds
    the DSL's own IR caches; compiled kernels are kept by `disk` instead (the DSL does not reuse them
    from its cache across processes, 4.8.1)."""
    from ...core.settings import cache_dir

    os.environ.setdefault("CUTE_DSL_CACHE_DIR", str(cache_dir() / "cutedsl"))
