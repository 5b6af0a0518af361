"""Input validation: every bad input becomes an InputError naming the argument."""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from .errors import InputError

_ARG_NAMES = {"mm": ("mat1", "mat2"), "bmm": ("batch1", "batch2"), "addmm": ("input", "mat1", "mat2")}
_RANKS = {"mm": (2, 2), "bmm": (3, 3), "addmm": (None, 2, 2)}


def validate_operands(op: str, tensors: Sequence[Any], alpha: float = 1.0, beta: float = 1.0) -> None:
    """Raise InputError unless `tensors` form a valid `op` problem gemmtune can tune.

    Example:
        >>> import torch
        >>> validate_operands("mm", [torch.ones(2, 3), torch.ones(3, 4)])
    """
    if op not in _ARG_NAMES:
        raise InputError(f"op: unknown op {op!r}; expected one of mm, addmm, bmm")
    names = _ARG_NAMES[op]
    if len(tensors) != len(names):
        raise InputError(f"{op}: expected {len(names)} tensors ({', '.join(names)}), got {len(tensors)}")
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, scalar in (("alpha", alpha), ("beta", beta)):
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not math.isfinite(scalar):
            raise InputError(f"{op}: {name} must be a finite real number, got {scalar!r}")
    for name, t, rank in zip(names, tensors, _RANKS[op]):
        if rank is not None and t.dim() != rank:
            raise InputError(f"{op}: {name} must be {rank}-D, got {t.dim()}-D with shape {tuple(t.shape)}")
        if t.is_complex() or not t.is_floating_point():
            raise InputError(f"{op}: {name} has dtype {t.dtype}; gemmtune supports float16, bfloat16, float32, float64")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise InputError(f"{op}: {name} has unsupported dtype {t.dtype}")
        if t.is_sparse or t.layout != torch.strided:
            raise InputError(f"{op}: {name} must be a dense strided tensor, got layout {t.layout}")
        if any(s < 0 for s in t.stride()):
            raise InputError(f"{op}: {name} has a negative stride {tuple(t.stride())}")
    mats = tensors[1:] if op == "addmm" else tensors
    mnames = names[1:] if op == "addmm" else names
    a, b = mats
    if a.dtype != b.dtype:
        raise InputError(f"{op}: {mnames[0]} is {a.dtype} but {mnames[1]} is {b.dtype}; cast them to one dtype")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise InputError(f"{op}: tensors are on different devices {sorted(map(str, devices))}")
    if a.shape[-1] != b.shape[-2]:
        raise InputError(f"{op}: inner dimensions differ: {mnames[0]} is {tuple(a.shape)} and "
                         f"{mnames[1]} is {tuple(b.shape)} (K {a.shape[-1]} != {b.shape[-2]})")
    if op == "bmm" and a.shape[0] != b.shape[0]:
        raise InputError(f"bmm: batch sizes differ: batch1 has {a.shape[0]}, batch2 has {b.shape[0]}")
    if op == "addmm":
        bias = tensors[0]
        if bias.dtype != a.dtype:
            raise InputError(f"addmm: input (bias) is {bias.dtype} but mat1 is {a.dtype}")
        out = (a.shape[0], b.shape[1])
        if bias.dim() > 2:
            raise InputError(f"addmm: input (bias) must be 0-, 1- or 2-D, got shape {tuple(bias.shape)}")
        try:
            torch.broadcast_shapes(tuple(bias.shape), out)
            ok = torch.broadcast_shapes(tuple(bias.shape), out) == out
        except RuntimeError:
            ok = False
        if not ok:
            raise InputError(f"addmm: input (bias) of shape {tuple(bias.shape)} does not broadcast to the output {out}")
