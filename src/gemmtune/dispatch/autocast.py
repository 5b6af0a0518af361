"""`torch.autocast` for gemmtune's ops: compute what torch would (`gemmtune.core.autocast`).

Example:
    >>> import torch
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     [t.dtype for t in cast((torch.randn(4, 3), torch.randn(3, 2)))]
    [torch.bfloat16, torch.bfloat16]
"""

from ..core.autocast import active_for, cast, disabled, enabled

__all__ = ["enabled", "active_for", "cast", "disabled"]
