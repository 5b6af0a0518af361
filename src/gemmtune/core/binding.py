"""Binding a kernel to the one problem it serves.

A warm dispatch entry, a `Selection`, a compiled graph's call of gemmtune's pick (`inductor.extern`) and
the fp8 dispatch each serve exactly one problem: every operand's shape, strides and dtype and the
device are fixed.  A template whose launcher offers `bound(*tensors)` (the Triton templates:
`templates.triton.base.bound_launcher`; aten's mm, bmm and addmm: the torch op; a padded twin of
either) can then build its argument list once and change only the pointers per call.
`bound_on_first_call` and `first_call_binding` do that on the first call, with that call's operands;
the tuner times each candidate the same way (`measure.runners.LocalRunner`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .layout import empty_output

Kernel = Callable[..., torch.Tensor]


def bound_to(kernel: Kernel, tensors: Sequence[torch.Tensor]) -> Kernel:
    """`kernel` bound to the problem of `tensors` (`kernel.bound(*tensors)`), or `kernel` itself where it
    has nothing to bind or its binding declines.

    Example:
        >>> def kernel(a): return a + 1
        >>> kernel.bound = lambda a: None if a < 0 else (lambda a: a + 2)
        >>> bound_to(kernel, (1,))(1), bound_to(kernel, (-1,)) is kernel, bound_to(len, ("ab",)) is len
        (3, True, True)
    """
    binder = getattr(kernel, "bound", None)
    return (binder(*tensors) if binder is not None else None) or kernel


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
    if getattr(kernel, "bound", None) is None:
        return [kernel]

    def first(*tensors: torch.Tensor, **kw: torch.Tensor) -> torch.Tensor:
        if cell[0] is first:
            cell[0] = bound_to(kernel, tensors)
        return cell[0](*tensors, **kw)

    cell: list[Kernel] = [first]
    return cell


def first_call_binding(kernel: Kernel) -> Kernel:
    """`kernel` itself where it has nothing to bind, else a callable that runs it bound to the problem of
    its first call (`bound_on_first_call`), passing `out=` on.

    Example:
        >>> def kernel(a, out=None): return a + 1
        >>> kernel.bound = lambda a: (lambda a, out=None: a + 2)
        >>> run = first_call_binding(kernel)
        >>> run(1), run(1, out=None), first_call_binding(len) is len
        (3, 3, True)
    """
    cell = bound_on_first_call(kernel)
    if cell[0] is kernel:
        return kernel
    return lambda *tensors, **kw: cell[0](*tensors, **kw)


def layout_kernel(ki: Any, runtime: dict, launch: Kernel, out_layout: str | None) -> Kernel:
    """A pick's kernel `kernel(*tensors, out=None)`: `launch` with the pick's runtime params, its output in
    `out_layout` (`core.layout`; for "padded", a padded twin's own output where its rows are those:
    `launch.padded_rows`), and `kernel.bound` (`bound_to`) where that output is row-major (`out_layout` as
    `core.layout.effective_layout` gives it: "padded" only where N's rows are padded).

    Example:
        >>> from gemmtune.core.inputs import KernelInputs
        >>> a, b = torch.ones(2, 3), torch.ones(3, 5)
        >>> kernel = layout_kernel(KernelInputs.from_tensors("mm", a, b), {}, lambda t, out=None: torch.mm(*t, out=out),
        ...                        "padded")
        >>> kernel(a, b).stride(), kernel(a, b).tolist()[1]
        ((8, 1), [3.0, 3.0, 3.0, 3.0, 3.0])
    """
    rows = getattr(launch, "padded_rows", None) if out_layout == "padded" else None

    def kernel(*tensors: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None and rows is not None:
            return rows(tensors, **runtime)
        if out is None and out_layout in ("col", "padded"):
            out = empty_output(ki.out_size, ki.result_dtype, ki.device, out_layout)
        return launch(tensors, out, **runtime)

    if hasattr(launch, "bound") and out_layout in (None, "row"):  # the eager dispatch binds it
        setattr(kernel, "bound", lambda *tensors: launch.bound(tensors, **runtime))
    return kernel
