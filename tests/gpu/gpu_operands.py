"""Operands the GPU tests share."""

from __future__ import annotations

import torch


def operands(op, M, K, N, dtype, b_layout, batch=1, device="cuda"):
    """(a, b), or (bias, a, b) for addmm, of an [M, K] @ [K, N] problem (`batch` of them for bmm).

    `b_layout`: "row" stores B as [K, N]; "col" stores it as [N, K] and passes its transpose (an
    nn.Linear weight).

    Example:
        >>> a, b = operands("mm", 2, 3, 4, torch.float32, "col", device="cpu")
        >>> a.shape, b.shape, b.stride()
        (torch.Size([2, 3]), torch.Size([3, 4]), (1, 3))
    """
    lead = (batch,) if op == "bmm" else ()
    a = torch.randn(*lead, M, K, dtype=dtype, device=device)
    b = (torch.randn(*lead, N, K, dtype=dtype, device=device).transpose(-1, -2) if b_layout == "col"
         else torch.randn(*lead, K, N, dtype=dtype, device=device))
    return (torch.randn(N, dtype=dtype, device=device), a, b) if op == "addmm" else (a, b)
