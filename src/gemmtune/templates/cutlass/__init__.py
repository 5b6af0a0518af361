"""CUTLASS CuTe DSL templates (optional extra `gemmtune[cutlass]`; docs/CUTLASS.md).

Nothing here imports the DSL at import time: `hopper_kernel` is imported by `compile` only.

Example:
    >>> from gemmtune.templates.cutlass import CutlassHopperTemplate
    >>> CutlassHopperTemplate.uid
    'cutlass_hopper'
"""

from .hopper import CutlassHopperTemplate

__all__ = ["CutlassHopperTemplate"]
