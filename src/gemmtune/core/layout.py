"""Output layouts and the rule that fixes them.

An output layout (`out_layout`) is None or "row" (row-major), "col" (each matrix column-major: strides
(1, M)) or "padded" (row-major rows padded to whole 16 bytes where N's are not, `padded_row`: the kind
of view of a padded output that Inductor's padding returns, though its strides can differ; the library's
kernels write its aligned rows directly).

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


OUT_LAYOUTS = (None, "row", "col", "padded")
ALIGN_BYTES = 16  # the row alignment vector loads, TMA and the library's fastest kernels need
STRIDE_BYTES = 128  # the row stride a padded row gets where that adds at most 1/16


def padded_row(n: int, itemsize: int) -> int:
    """`n` elements of `itemsize` bytes rounded up to `STRIDE_BYTES` where that adds at most n/16, else to
    `ALIGN_BYTES`; `n` itself where it is a whole number of `ALIGN_BYTES` already.  A symbolic `n` (a
    dynamic compile) is specialised to its value: a graph's strides then hold at every size it runs.

    Example:
        >>> padded_row(50257, 2), padded_row(70, 2), padded_row(19, 4), padded_row(4096, 2), padded_row(1000, 4)
        (50304, 72, 20, 4096, 1000)
    """
    n, align = int(n), max(1, ALIGN_BYTES // itemsize)
    if n % align == 0:
        return n
    for step in (max(1, STRIDE_BYTES // itemsize), align):
        up = -(-n // step) * step
        if up - n <= n // 16 or step == align:
            return up
    return n


def effective_layout(out_layout: str | None, n: int, itemsize: int) -> str | None:
    """`out_layout` as it lays out rows of `n` elements of `itemsize` bytes: "padded" is None (row-major)
    where those rows are whole 16 bytes already, so it shares the row-major picks.

    Example:
        >>> effective_layout("padded", 19, 4), effective_layout("padded", 20, 4), effective_layout("col", 20, 4)
        ('padded', None, 'col')
    """
    return None if out_layout == "padded" and padded_row(n, itemsize) == n else out_layout


def call_layout(out_layout: str | None, b: torch.Tensor) -> str | None:
    """`effective_layout` of a call whose last operand is `b` ([..., K, N]: its N, its element size).

    Example:
        >>> call_layout("padded", torch.ones(4, 19)), call_layout("padded", torch.ones(4, 20))
        ('padded', None)
    """
    return effective_layout(out_layout, b.shape[-1], b.dtype.itemsize)


def output_strides(size: tuple[int, ...], out_layout: str | None, itemsize: int = 0) -> tuple[int, ...]:
    """Row-major strides; for "col" the last two dims swapped ([M, N] with strides (1, M)); for
    "padded" rows of `padded_row(N, itemsize)` elements.

    Example:
        >>> output_strides((4, 8), None), output_strides((4, 8), "col"), output_strides((2, 4, 8), "col")
        ((8, 1), (1, 4), (32, 1, 4))
        >>> output_strides((4, 7), "padded", 2), output_strides((2, 4, 7), "padded", 2)
        ((8, 1), (32, 8, 1))
    """
    if out_layout == "padded":
        if itemsize <= 0:
            raise ValueError("output_strides: a padded layout needs the element size")
        row = padded_row(size[-1], itemsize)
        return contiguous_strides((*size[:-1], row))
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
        >>> empty_output((4, 7), torch.bfloat16, "cpu", "padded").stride()
        (8, 1)
    """
    return torch.empty_strided(size, output_strides(size, out_layout, dtype.itemsize), dtype=dtype, device=device)


def in_layout(t: torch.Tensor, out_layout: str | None) -> torch.Tensor:
    """`t` itself where it has `out_layout`'s strides, else a differentiable copy that has them.

    Example:
        >>> t = torch.ones(3, 5, dtype=torch.float16)
        >>> in_layout(t, None) is t, in_layout(t, "col").stride(), in_layout(t, "padded").stride()
        (True, (1, 3), (8, 1))
    """
    want = output_strides(tuple(t.shape), out_layout, t.dtype.itemsize)
    if t.stride() == want:
        return t
    return t.new_empty_strided(tuple(t.shape), want).copy_(t)


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
