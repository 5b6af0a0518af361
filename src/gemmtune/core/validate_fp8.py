"""Validation of `scaled_mm` operands: torch's rules for `torch._scaled_mm`, each a typed InputError.

gemmtune applies the rules torch enforces on CUDA (cuBLASLt's) on every device, so a problem that
validates on CPU is one a GPU accepts too (torch's CPU kernel is laxer: it takes a row-major `b`,
K or N not a multiple of 16, a float32 bias with a bfloat16 output).  docs/FP8.md lists them:

- `a` [M, K] and `b` [K, N] are 2-D float8 (e4m3fn or e5m2; not both e5m2), on one device;
- `a` is row-major (contiguous), `b` column-major (`b.t()` contiguous: a `[N, K]` weight transposed);
- K and N are multiples of 16;
- scales are float32: tensor-wise, one element each; or row-wise, `scale_a` [M, 1] and `scale_b`
  [1, N], contiguous (then the output is bfloat16, the rule of every GPU torch runs fp8 on; on a CUDA
  device also float16 or float32 where torch's kernel there takes them: `rowwise_out_dtypes`);
- `out_dtype` is bfloat16, float16 or float32 (gemmtune does not tune float8 outputs);
- `bias` is 1-D of N elements, of the output's dtype (bfloat16 or float16; none with float32);
- `use_fast_accum` is a bool.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import torch

from .errors import InputError

__all__ = ["validate_scaled_mm", "check_rules", "rowwise_out_dtypes", "FP8_DTYPES", "SCALE_KINDS", "OUT_DTYPES",
           "ARG_NAMES"]

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
"""The operand dtypes of `scaled_mm` (docs/FP8.md)."""
SCALE_KINDS = ("tensorwise", "rowwise")

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ARG_NAMES = ("a", "b", "scale_a", "scale_b", "bias")
_OP = "scaled_mm"


def validate_scaled_mm(tensors: Sequence[Any], out_dtype: Any, fast_accum: Any, alpha: Any = 1.0,
                       beta: Any = 1.0) -> None:
    """Raise InputError unless `tensors` (a, b, scale_a, scale_b[, bias]) form a valid scaled_mm problem.

    Example:
        >>> import torch
        >>> a = torch.ones(16, 32).to(torch.float8_e4m3fn)
        >>> b = torch.ones(16, 32).to(torch.float8_e4m3fn).t()
        >>> one = torch.tensor(1.0)
        >>> validate_scaled_mm((a, b, one, one), torch.bfloat16, False)
        >>> validate_scaled_mm((a, b.contiguous(), one, one), torch.bfloat16, False)
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: scaled_mm: b must be column-major (a [N, K] weight transposed: w.t()), got strides (16, 1) for shape (32, 16)
    """
    if not (alpha == 1.0 and beta == 1.0):
        raise InputError(f"{_OP}: alpha and beta belong to addmm only (got alpha={alpha!r}, beta={beta!r})")
    if len(tensors) not in (4, 5):
        raise InputError(f"{_OP}: expected 4 or 5 tensors (a, b, scale_a, scale_b[, bias]), got {len(tensors)}")
    for name, t in zip(ARG_NAMES, tensors):
        _check_tensor(name, t)
    devices = {t.device for t in tensors}
    check_rules(tensors, out_dtype, fast_accum, rowwise_out=lambda: rowwise_out_dtypes(tensors[0].device))
    if len(devices) > 1:
        raise InputError(f"{_OP}: tensors are on different devices {sorted(map(str, devices))}; move them to one device")
    _check_memory(tensors[0], tensors[1], out_dtype)


def check_rules(tensors: Sequence[torch.Tensor], out_dtype: Any, fast_accum: Any,
                rowwise_out: Any = lambda: (torch.bfloat16,)) -> None:
    """The rules of `validate_scaled_mm` that read only sizes, strides and dtypes (no data, no device),
    so they also judge meta tensors: e.g. the inputs of an Inductor lowering (`gemmtune.inductor`).
    `rowwise_out()`: the output dtypes row-wise scales take (default: bfloat16, the rule of every GPU).

    Example:
        >>> import torch
        >>> meta = lambda *s, st, dt=torch.float8_e4m3fn: torch.empty_strided(s, st, dtype=dt, device="meta")
        >>> a, b, one = meta(16, 32, st=(32, 1)), meta(32, 16, st=(1, 32)), meta(st=(), dt=torch.float32)
        >>> check_rules((a, b, one, one), torch.bfloat16, False)
        >>> check_rules((a, b, one, one), torch.float8_e4m3fn, False)
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: scaled_mm: out_dtype must be one of torch.bfloat16, torch.float16, torch.float32, got torch.float8_e4m3fn (gemmtune does not tune float8 outputs)
    """
    if len(tensors) not in (4, 5):
        raise InputError(f"{_OP}: expected 4 or 5 tensors (a, b, scale_a, scale_b[, bias]), got {len(tensors)}")
    a, b, scale_a, scale_b = tensors[:4]
    _check_options(out_dtype, fast_accum)
    _check_matrices(a, b)
    _check_scales(scale_a, scale_b, a.shape[0], b.shape[1], out_dtype, rowwise_out)
    if len(tensors) == 5:
        _check_bias(tensors[4], b.shape[1], out_dtype)


def _check_tensor(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{_OP}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested or t.layout != torch.strided:
        raise InputError(f"{_OP}: {name} must be a dense strided tensor")
    if t.device.type == "meta":
        raise InputError(f"{_OP}: {name} is on the meta device (no data): gemmtune runs and times kernels")


def _check_options(out_dtype: Any, fast_accum: Any) -> None:
    if not isinstance(fast_accum, bool):
        raise InputError(f"{_OP}: use_fast_accum must be a bool, got {type(fast_accum).__name__} {fast_accum!r}")
    if out_dtype not in OUT_DTYPES:
        raise InputError(f"{_OP}: out_dtype must be one of torch.bfloat16, torch.float16, torch.float32, got "
                         f"{out_dtype!r} (gemmtune does not tune float8 outputs)")


def _check_matrices(a: torch.Tensor, b: torch.Tensor) -> None:
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2:
            raise InputError(f"{_OP}: {name} must be a matrix (2-D), got {t.dim()}-D with shape {tuple(t.shape)}")
        if t.dtype not in FP8_DTYPES:
            raise InputError(f"{_OP}: {name} must be float8 (torch.float8_e4m3fn or torch.float8_e5m2), got "
                             f"{t.dtype}; quantise it first (x.to(torch.float8_e4m3fn) after scaling)")
    if a.dtype == b.dtype == torch.float8_e5m2:
        raise InputError(f"{_OP}: a and b are both float8_e5m2: the multiplication of two e5m2 matrices is not "
                         f"supported (cuBLASLt); make one of them float8_e4m3fn")
    if a.shape[1] != b.shape[0]:
        raise InputError(f"{_OP}: a and b shapes cannot be multiplied: a is {tuple(a.shape)} and b is "
                         f"{tuple(b.shape)} (K {a.shape[1]} != {b.shape[0]})")
    if not a.is_contiguous():
        raise InputError(f"{_OP}: a must be row-major (contiguous), got strides {a.stride()} for shape "
                         f"{tuple(a.shape)}; pass a.contiguous()")
    if not b.t().is_contiguous():
        raise InputError(f"{_OP}: b must be column-major (a [N, K] weight transposed: w.t()), got strides "
                         f"{b.stride()} for shape {tuple(b.shape)}")
    K, N = a.shape[1], b.shape[1]
    if K % 16 or N % 16:
        raise InputError(f"{_OP}: K ({K}) and N ({N}) must be multiples of 16 (b is {tuple(b.shape)}); pad them")


def _check_scales(scale_a: torch.Tensor, scale_b: torch.Tensor, M: int, N: int, out_dtype: torch.dtype,
                  rowwise_out: Any) -> None:
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s.dtype != torch.float32:
            raise InputError(f"{_OP}: {name} must be float32, got {s.dtype}")
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return  # tensor-wise
    rowwise = (tuple(scale_a.shape) == (M, 1) and tuple(scale_b.shape) == (1, N))
    if not rowwise:
        raise InputError(f"{_OP}: invalid scales: scale_a {tuple(scale_a.shape)} and scale_b "
                         f"{tuple(scale_b.shape)}; use tensor-wise scales (one element each) or row-wise "
                         f"scales, scale_a [M, 1] = ({M}, 1) and scale_b [1, N] = (1, {N})")
    if not (scale_a.is_contiguous() and scale_b.is_contiguous()):
        raise InputError(f"{_OP}: row-wise scales must be contiguous (got strides {scale_a.stride()} and "
                         f"{scale_b.stride()}); pass .contiguous()")
    if out_dtype != torch.bfloat16 and out_dtype not in rowwise_out():
        raise InputError(f"{_OP}: row-wise scales need out_dtype=torch.bfloat16, got {out_dtype} (torch takes "
                         f"float16 and float32 outputs only on some GPUs: Hopper with cuBLASLt 12.9 or later)")


def rowwise_out_dtypes(device: torch.device) -> tuple[torch.dtype, ...]:
    """The output dtypes row-wise scales take on `device`: bfloat16, the rule of every GPU torch runs
    fp8 on (where it computes row-wise scaling with its own CUTLASS kernel) and so of the CPU, where
    gemmtune keeps the GPUs' rules; on a CUDA device also float16 and float32 where torch's kernel
    there takes them (on Hopper with cuBLASLt 12.9 or later torch hands row-wise scaling to cuBLASLt),
    asked of torch once per device with a 16x16x16 problem (not while a CUDA graph is captured).

    Example:
        >>> rowwise_out_dtypes(torch.device("cpu"))
        (torch.bfloat16,)
    """
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return (torch.bfloat16,)
    return _torch_rowwise_out(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _torch_rowwise_out(index: int) -> tuple[torch.dtype, ...]:
    device = torch.device("cuda", index)
    a = torch.zeros(16, 16, device=device).to(torch.float8_e4m3fn)
    sa, sb = torch.ones(16, 1, device=device), torch.ones(1, 16, device=device)
    taken = [torch.bfloat16]
    for out_dtype in (torch.float16, torch.float32):
        try:
            with torch._C.DisableTorchFunction():  # a ScaledMMRouter around the caller would route the probe
                torch._scaled_mm(a, a.t(), sa, sb, out_dtype=out_dtype)
        except (RuntimeError, ValueError, NotImplementedError):
            continue
        taken.append(out_dtype)
    return tuple(taken)


def _check_bias(bias: torch.Tensor, N: int, out_dtype: torch.dtype) -> None:
    if bias.dim() != 1 or bias.shape[0] != N:
        raise InputError(f"{_OP}: bias must be 1-D of N = {N} elements, got shape {tuple(bias.shape)}")
    if out_dtype == torch.float32:
        raise InputError(f"{_OP}: a bias is not supported when out_dtype is torch.float32")
    if bias.dtype != out_dtype:
        raise InputError(f"{_OP}: bias must be {out_dtype} to compute a {out_dtype} output, got {bias.dtype}")


def _check_memory(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> None:
    from .validate import ProblemTooLargeError, available_bytes

    out_numel = a.shape[0] * b.shape[1]
    need = out_numel * (out_dtype.itemsize + 8) + 8 * (a.numel() + b.numel())
    if need < 256 << 20:
        return
    have = available_bytes(a.device)
    if have is not None and need > have:
        raise ProblemTooLargeError(f"{_OP}: too large to tune on {a.device}: tuning needs at least "
                                   f"{need / 2**30:,.1f} GiB (output + float64 reference + float64 operand "
                                   f"copies) but only {have / 2**30:,.1f} GiB is free")

