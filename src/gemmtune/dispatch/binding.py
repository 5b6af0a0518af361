"""Binding a warm dispatch entry's launch to its problem.

A dict entry of the eager dispatch serves exactly one problem: its key fixes every operand's shape,
strides and dtype and the device.  A template whose launcher offers `bound(*tensors)` (the Triton
templates: `templates.triton.base.bound_launcher`; aten's mm, bmm and addmm: the torch op) can then
build its argument list once and change only the pointers per call.  `bound_on_first_call` does that on
the entry's first call, with that call's operands.
"""

from __future__ import annotations

from typing import Callable

import torch

Kernel = Callable[..., torch.Tensor]


def bound_on_first_call(kernel: Kernel) -> list[Kernel]:
    """A one-element cell holding `kernel`; where `kernel.bound` exists, the cell first holds a
    callable that, on the first call, replaces itself by `kernel.bound(*tensors)` (or by `kernel`
    when the binding declines) and runs it.  Callers call `cell[0](*tensors)`.

    Example:
        >>> calls = []
        >>> def kernel(a): return a + 1
        >>> kernel.bound = lambda a: calls.append(a) or (lambda a: a + 2)
        >>> cell = bound_on_first_call(kernel)
        >>> cell[0](1), cell[0](1), calls
        (3, 3, [1])
    """
    binder = getattr(kernel, "bound", None)
    if binder is None:
        return [kernel]

    def first(*tensors: torch.Tensor) -> torch.Tensor:
        if cell[0] is first:
            cell[0] = binder(*tensors) or kernel
        return cell[0](*tensors)

    cell: list[Kernel] = [first]
    return cell
