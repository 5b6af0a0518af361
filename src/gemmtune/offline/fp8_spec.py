"""The scaled_mm side of a problem spec (`offline/suite.py`): its checks and its quantised operands.

A scaled_mm spec names A's float8 dtype (`float8_e4m3fn` or `float8_e5m2`; B is `float8_e4m3fn`, since
torch refuses two e5m2 matrices), its scale kind, `tensorwise` or `rowwise`, its output dtype
(`bfloat16`, the default, `float16` or `float32`; row-wise scales need bfloat16) and whether it
accumulates fast (`fast_accum`, torch's `use_fast_accum`); B is column-major (a `[N, K]` weight
transposed), as torch requires.  The operands are random normal data quantised as torchao quantises:
the scale is amax / the dtype's largest finite value (per tensor, or per row of A and per row of the
weight), the data divided by it and cast.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.errors import InputError
from ..core.inputs import FP8_DTYPES, SCALE_KINDS, dtype_name, parse_dtype

__all__ = ["check_fp8_spec", "check_fp8_output", "out_dtype_name", "fp8_operands", "quantise", "OUT_DTYPE_NAMES"]

OUT_DTYPE_NAMES = ("bfloat16", "float16", "float32")
"""The output dtypes a scaled_mm spec may name (gemmtune does not tune float8 outputs)."""


def check_fp8_spec(op: str, dtype: str, scales: str, b_layout: str, out_dtype: str = "",
                   fast_accum: bool = False) -> None:
    """InputError unless the spec's dtype, scales, B layout, output dtype and fast accumulation fit its op.

    Example:
        >>> check_fp8_spec("scaled_mm", "float8_e4m3fn", "rowwise", "col")
        >>> check_fp8_spec("mm", "float32", "rowwise", "row")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: scales: 'rowwise' belongs to op scaled_mm (got op mm)
    """
    fp8 = parse_dtype(dtype) in FP8_DTYPES
    if op != "scaled_mm":
        for key, value in (("scales", scales), ("out_dtype", out_dtype), ("fast_accum", fast_accum)):
            if value:
                raise InputError(f"{key}: {value!r} belongs to op scaled_mm (got op {op})")
        if fp8:
            raise InputError(f"dtype: {dtype} is an fp8 dtype: use op scaled_mm (--op scaled_mm)")
        return
    if not fp8:
        raise InputError(f"dtype: scaled_mm needs an fp8 dtype ({', '.join(dtype_name(d) for d in FP8_DTYPES)}), "
                         f"got {dtype}")
    if scales not in SCALE_KINDS:
        raise InputError(f"scales: expected one of {', '.join(SCALE_KINDS)} for scaled_mm, got {scales!r}")
    if b_layout != "col":
        raise InputError("b_layout: scaled_mm's B must be column-major (b_layout 'col', --b-layout col), "
                         f"as torch._scaled_mm requires; got {b_layout!r}")
    check_fp8_output(scales, out_dtype, fast_accum)


def check_fp8_output(scales: str, out_dtype: str, fast_accum: bool) -> None:
    """InputError unless a scaled_mm spec's `out_dtype` ("" is bfloat16) and `fast_accum` are ones torch takes.

    Example:
        >>> check_fp8_output("rowwise", "float32", False)
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: out_dtype: row-wise scales need out_dtype bfloat16, got 'float32'
    """
    if not isinstance(fast_accum, bool):
        raise InputError(f"fast_accum: expected true or false, got {fast_accum!r}")
    name = out_dtype_name(out_dtype)
    if scales == "rowwise" and name != "bfloat16":
        raise InputError(f"out_dtype: row-wise scales need out_dtype bfloat16, got {out_dtype!r}")


def out_dtype_name(out_dtype: str) -> str:
    """The canonical name of a scaled_mm spec's output dtype ("": bfloat16, torch's `_scaled_mm` default here).

    Example:
        >>> out_dtype_name(""), out_dtype_name("fp16")
        ('bfloat16', 'float16')
    """
    name = "bfloat16" if out_dtype == "" else ""
    if name == "" and isinstance(out_dtype, str):
        try:
            name = dtype_name(parse_dtype(out_dtype))
        except InputError:
            pass
    if name not in OUT_DTYPE_NAMES:
        raise InputError(f"out_dtype: expected one of {', '.join(OUT_DTYPE_NAMES)} for scaled_mm, got {out_dtype!r} "
                         "(gemmtune does not tune float8 outputs)")
    return name


def quantise(x: torch.Tensor, dtype: torch.dtype, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / scale cast to `dtype`, scale): scale = amax / dtype's max, per row ([rows, 1]) or per tensor.

    Example:
        >>> q, s = quantise(torch.tensor([[1.0, -448.0]]), torch.float8_e4m3fn, rowwise=True)
        >>> q.float().tolist(), s.tolist()
        ([[1.0, -448.0]], [[1.0]])
    """
    amax = x.abs().amax(dim=1, keepdim=True) if rowwise else x.abs().amax()
    scale = (amax.float() / torch.finfo(dtype).max).clamp(min=1e-12)
    return (x / scale).to(dtype), scale


def fp8_operands(M: int, K: int, N: int, dtype: str, scales: str, device: str, g: torch.Generator) -> tuple[Any, ...]:
    """(a, b, scale_a, scale_b) of a scaled_mm spec: quantised random normal data, B column-major."""
    rowwise = scales == "rowwise"
    a, sa = quantise(torch.randn(M, K, generator=g), parse_dtype(dtype), rowwise)
    w, sw = quantise(torch.randn(N, K, generator=g), torch.float8_e4m3fn, rowwise)
    return tuple(t.to(device) for t in (a, w.t(), sa, sw.t().contiguous() if rowwise else sw))
