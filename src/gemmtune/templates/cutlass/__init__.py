"""CUTLASS templates on NVIDIA's CuTe DSL kernels (optional extra `gemmtune[cutlass]`; docs/CUTLASS.md).

Nothing here imports the DSL at import time: `cutlass.operators` is imported on first use.

Example:
    >>> from gemmtune.templates.cutlass import CutlassOperatorsTemplate
    >>> CutlassOperatorsTemplate.uid
    'cutlass_operators'
"""

from .operators import CutlassOperatorsTemplate

__all__ = ["CutlassOperatorsTemplate"]
