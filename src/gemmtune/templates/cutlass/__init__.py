"""CUTLASS CuTe DSL templates (optional extra `gemmtune[cutlass]`; docs/CUTLASS.md).

Nothing here imports the DSL at import time: `hopper_kernel` and `cutlass.operators` are imported on first use.

Example:
    >>> from gemmtune.templates.cutlass import CutlassHopperTemplate
    >>> CutlassHopperTemplate.uid, CutlassOperatorsTemplate.uid
    ('cutlass_hopper', 'cutlass_operators')
"""

from .hopper import CutlassHopperTemplate
from .operators import CutlassOperatorsTemplate

__all__ = ["CutlassHopperTemplate", "CutlassOperatorsTemplate"]
