"""Output layouts and the rule that fixes them.

A selection made only of library (extern) kernels keeps a FlexibleLayout: the
caller may still pick the output strides.  As soon as a generated template is a
candidate, code is generated for one concrete stride order, so every choice
gets the same FixedLayout before compilation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, following torch's convention for size-0/1 dims (`max(s, 1)`).

    `torch.sym_max` keeps symbolic sizes (fake tensors under torch.compile) symbolic.

    Example:
        >>> contiguous_strides((2, 3, 0))
        (3, 1, 1)
    """
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc = acc * torch.sym_max(s, 1)
    return tuple(reversed(strides))


def output_strides(size: tuple[int, ...], out_layout: str | None) -> tuple[int, ...]:
    """Row-major strides, or for "col" the last two dims swapped ([M, N] with strides (1, M)).

    Example:
        >>> output_strides((4, 8), None), output_strides((4, 8), "col"), output_strides((2, 4, 8), "col")
        ((8, 1), (1, 4), (32, 1, 4))
    """
    if out_layout != "col":
        return contiguous_strides(size)
    m1, n1 = torch.sym_max(size[-2], 1), torch.sym_max(size[-1], 1)
    lead = (m1 * n1,) if len(size) == 3 else ()
    return (*lead, 1, m1)


def empty_output(size: tuple[int, ...], dtype: torch.dtype, device: str | torch.device,
                 out_layout: str | None) -> torch.Tensor:
    """An uninitialised output of `size` with `output_strides(size, out_layout)`.

    Example:
        >>> empty_output((4, 8), torch.float32, "cpu", "col").stride()
        (1, 4)
    """
    return torch.empty_strided(size, output_strides(size, out_layout), dtype=dtype, device=device)


@dataclass(frozen=True)
class FlexibleLayout:
    """Size, dtype and device are known; the strides may still be chosen by the caller.

    Example:
        >>> import torch
        >>> FlexibleLayout((4, 8), torch.float32, "cpu").fix().stride
        (8, 1)
    """

    size: tuple[int, ...]
    dtype: torch.dtype
    device: str

    kind = "flexible"

    @property
    def stride(self) -> tuple[int, ...]:
        """The stride the layout would get if fixed now (row-major)."""
        return contiguous_strides(self.size)

    def fix(self, stride: tuple[int, ...] | None = None) -> "FixedLayout":
        return FixedLayout(self.size, self.dtype, self.device, stride or contiguous_strides(self.size))


@dataclass(frozen=True)
class FixedLayout:
    """Size, dtype, device and strides are all decided.

    Example:
        >>> import torch
        >>> FixedLayout((4, 8), torch.float32, "cpu", (8, 1)).kind
        'fixed'
    """

    size: tuple[int, ...]
    dtype: torch.dtype
    device: str
    stride: tuple[int, ...]

    kind = "fixed"

    def fix(self, stride: tuple[int, ...] | None = None) -> "FixedLayout":
        return self

    def empty(self) -> torch.Tensor:
        return torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)


Layout = FlexibleLayout | FixedLayout
