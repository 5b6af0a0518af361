"""`torch.autocast` for gemmtune's ops: compute what torch would.

Under `torch.autocast(device_type, dtype)` torch casts the floating-point
operands of `mm`, `addmm`, `bmm` and `F.linear` (float64 excepted, and only
those on the autocast device) to the autocast dtype before running the op, so
the result has that dtype.  gemmtune does the same before it looks the problem
up: the cast problem is the one tuned and run, on every backend, so the result's
dtype is torch's whatever kernel wins.  A family that cannot run the cast dtype
(numba and NumPy run float32/float64 only) then offers no candidate, and
`NoCandidatesError` says so; it never returns the un-cast dtype.

`gemmtune.tune` and `Selection.__call__` do the same: under autocast the cast problem is the one
tuned (every candidate timed in torch's dtype) and the one a Selection accepts.

The eager warm path pays one call (`enabled()`, one C check of every device's
autocast flag); the operands are cast only when autocast is on.

Example:
    >>> import torch
    >>> a, b = torch.randn(4, 3), torch.randn(3, 2)
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     [t.dtype for t in cast((a, b))]
    [torch.bfloat16, torch.bfloat16]
    >>> [t.dtype for t in cast((a, b))]
    [torch.float32, torch.float32]
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, TypeVar

import torch

from .inputs import place_operands
from .validate import TUNE_OPTIONS, check_tune_options

__all__ = ["enabled", "active_for", "cast", "disabled", "tunes_cast_problem"]
R = TypeVar("R")

enabled = torch._C._is_any_autocast_enabled  # one C call: is autocast on for any device type?


def _device_type(tensors: tuple) -> str | None:
    """The device type of mat1 (the operand before last), None when it is not a tensor."""
    a = tensors[-2] if len(tensors) >= 2 else None
    return a.device.type if isinstance(a, torch.Tensor) else None


def _on(dev: str | None) -> bool:
    """Whether autocast is on for device type `dev` (never for one autocast does not know, e.g. meta)."""
    if dev is None:
        return False
    try:
        return torch.is_autocast_enabled(dev)
    except RuntimeError:  # "unknown device type for autocast"
        return False


def active_for(tensors: tuple) -> bool:
    """Whether torch's autocast is on for the device type of these operands (mat1's)."""
    return _on(_device_type(tensors))


def tunes_cast_problem(tune: Callable[..., R]) -> Callable[..., R]:
    """Wrap `tune(op, *tensors, device=..., **options)`: under autocast it tunes the problem torch would
    compute (the operands cast as `cast` casts them, after moving them to `device`), with autocast off
    while every candidate runs, so that aten and the generated kernels are timed in the same dtype.
    scaled_mm is not cast (torch's autocast leaves `torch._scaled_mm` alone: its operands are float8).
    `tune`'s options are checked here first (`validate.check_tune_options`), before any operand moves."""
    @functools.wraps(tune)
    def wrapper(op: Any, *tensors: Any, device: Any = None, **options: Any) -> R:
        check_tune_options(**{k: v for k, v in options.items() if k in TUNE_OPTIONS})
        if enabled() and op != "scaled_mm":
            placed = place_operands(tensors, device)
            if active_for(placed):
                cast_ = cast(placed)
                with disabled(cast_):
                    return tune(op, *cast_, **options)
        return tune(op, *tensors, device=device, **options)

    return wrapper


def cast(tensors: tuple) -> tuple:
    """`tensors` as torch's autocast would hand them to mm/addmm/bmm (unchanged when it is off).

    Traceable by `torch.compile` (it only calls `torch.is_autocast_enabled`,
    `torch.get_autocast_dtype` and `Tensor.to`).
    """
    dev = _device_type(tensors)
    if dev is None or not _on(dev):
        return tensors
    dtype = torch.get_autocast_dtype(dev)
    return tuple(t.to(dtype) if _eligible(t, dev) else t for t in tensors)


def _eligible(t: Any, dev: str) -> bool:
    """What autocast casts: floating-point tensors of the autocast device, float64 excepted."""
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            and t.device.type == dev)


def disabled(tensors: tuple) -> ContextManager[Any]:
    """Autocast off for the block (tuning runs every candidate and its checks in the problem's own dtype)."""
    dev = _device_type(tensors)
    if dev is None or not _on(dev):
        return nullcontext()
    return torch.autocast(dev, enabled=False)
