"""KernelInputs: the concrete description of one GEMM problem.

A problem is everything a kernel's speed or result depends on: the op, shapes,
strides, dtypes, device and the addmm scalars.  Two calls with equal
`problem_key` can share a tuning result.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import torch

from .dtype_names import canonical
from .errors import InputError
from .validate_fp8 import FP8_DTYPES, SCALE_KINDS, validate_scaled_mm

__all__ = ["OPS", "SUPPORTED_DTYPES", "FP8_DTYPES", "SCALE_KINDS", "KernelInputs", "TensorMeta", "dtype_name",
           "parse_dtype", "device_str", "place_operands", "stand_in"]

OPS = ("mm", "addmm", "bmm", "scaled_mm")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> `"bfloat16"`."""
    return str(dtype).replace("torch.", "")


def parse_dtype(name: str) -> torch.dtype:
    """Parse a dtype name (`bf16`, `bfloat16`, `torch.float16`, `fp32`, ...)."""
    return getattr(torch, canonical(name))  # the names of SUPPORTED_DTYPES and FP8_DTYPES


@dataclass(frozen=True)
class TensorMeta:
    """Shape, strides, dtype and device of one operand (no data)."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorMeta":
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, device_str(t.device))


def stand_in(size: Any, stride: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """A real tensor of this size and stride (stride-0 broadcasts too) over random normal data.

    Example:
        >>> stand_in((2, 3), (0, 1), torch.float32, "cpu").stride()
        (0, 1)
    """
    size, stride = tuple(size), tuple(stride)
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride) if n > 0)
    return torch.randn(span if all(size) else 0, device=device).to(dtype).as_strided(size, stride)


def device_str(device: torch.device) -> str:
    """The device as gemmtune names it: "cuda:<index>" (the current device where torch gave none), or the type.

    Example:
        >>> device_str(torch.device("cpu"))
        'cpu'
    """
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


@dataclass(frozen=True)
class KernelInputs:
    """The inputs of one GEMM op, described without their data.

    `operands` follows the op's argument order: mm(a, b), addmm(bias, a, b),
    bmm(a, b), scaled_mm(a, b, scale_a, scale_b[, bias]).  Shapes use M, K, N for
    C[M, N] = A[M, K] @ B[K, N].  `out_dtype` and `fast_accum` are scaled_mm's
    (None and False for the other ops, whose output has the operands' dtype).

    Example:
        >>> import torch
        >>> ki = KernelInputs.from_tensors("mm", torch.randn(8, 4), torch.randn(4, 2))
        >>> (ki.M, ki.K, ki.N), ki.describe()
        ((8, 4, 2), 'mm(8x4, 4x2)')
    """

    op: str
    operands: tuple[TensorMeta, ...]
    alpha: float = 1.0
    beta: float = 1.0
    out_dtype: torch.dtype | None = None
    fast_accum: bool = False

    # -- construction -----------------------------------------------------
    @classmethod
    def from_tensors(cls, op: str, *tensors: Any, alpha: float = 1.0, beta: float = 1.0,
                     out_dtype: torch.dtype | None = None, fast_accum: bool = False) -> "KernelInputs":
        """Validate `tensors` for `op` and describe them; raises InputError naming the problem.
        `out_dtype` (default bfloat16) and `fast_accum` belong to scaled_mm only."""
        from .validate import validate_operands

        if op == "scaled_mm":
            out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
            validate_scaled_mm(tensors, out_dtype, fast_accum, alpha, beta)
            return cls(op, tuple(TensorMeta.of(t) for t in tensors), 1.0, 1.0, out_dtype, bool(fast_accum))
        if out_dtype is not None or fast_accum:
            raise InputError(f"{op}: out_dtype and use_fast_accum belong to scaled_mm only "
                             f"(got out_dtype={out_dtype!r}, use_fast_accum={fast_accum!r})")
        validate_operands(op, tensors, alpha, beta)
        return cls(op, tuple(TensorMeta.of(t) for t in tensors), float(alpha), float(beta))

    def options(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this problem with `from_tensors` from its operands.

        Example:
            >>> KernelInputs.from_tensors("mm", torch.ones(2, 2), torch.ones(2, 2)).options()
            {'alpha': 1.0, 'beta': 1.0}
        """
        if self.op == "scaled_mm":
            return {"out_dtype": self.out_dtype, "fast_accum": self.fast_accum}
        return {"alpha": self.alpha, "beta": self.beta}

    # -- shape views ------------------------------------------------------
    @property
    def a(self) -> TensorMeta:
        return self.operands[1] if self.op == "addmm" else self.operands[0]

    @property
    def b(self) -> TensorMeta:
        return self.operands[2] if self.op == "addmm" else self.operands[1]

    @property
    def bias(self) -> TensorMeta | None:
        if self.op == "scaled_mm":
            return self.operands[4] if len(self.operands) > 4 else None
        return self.operands[0] if self.op == "addmm" else None

    @property
    def scales(self) -> str | None:
        """scaled_mm's scale kind: "tensorwise" (one scale per operand) or "rowwise" ([M, 1] and [1, N]);
        None for the other ops.  Both scales decide: with M = 1 a row-wise `scale_a` [1, 1] holds one
        element too, and `scale_b` [1, N] still scales each column."""
        if self.op != "scaled_mm":
            return None
        one = all(math.prod(s.size) == 1 for s in self.operands[2:4])
        return "tensorwise" if one else "rowwise"

    @property
    def result_dtype(self) -> torch.dtype:
        """The output's dtype: scaled_mm's `out_dtype`, else the operands' dtype."""
        return self.out_dtype if self.out_dtype is not None else self.dtype

    @property
    def batch(self) -> int:
        return self.a.size[0] if self.op == "bmm" else 1

    @property
    def M(self) -> int:
        return self.a.size[-2]

    @property
    def K(self) -> int:
        return self.a.size[-1]

    @property
    def N(self) -> int:
        return self.b.size[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.a.dtype

    @property
    def device(self) -> str:
        return self.a.device

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def out_size(self) -> tuple[int, ...]:
        return (self.batch, self.M, self.N) if self.op == "bmm" else (self.M, self.N)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.M * self.N * self.K

    def b_layout(self) -> str:
        """'row' when B's last dim is contiguous, 'col' when B is a transposed contiguous matrix."""
        s = self.b.stride
        if s[-1] == 1:
            return "row"
        if s[-2] == 1:
            return "col"
        return "strided"

    def describe(self) -> str:
        """Inductor-style `op(AxB, CxD)` listing every operand's size (scaled_mm: the two matrices, the
        scale kind, the bias's length, the output dtype and fast accumulation)."""
        if self.op == "scaled_mm":
            bias = f", bias {self.N}" if self.bias is not None else ""
            fast = ", fast_accum" if self.fast_accum else ""
            return (f"scaled_mm({self.M}x{self.K}, {self.K}x{self.N}, {self.scales}{bias}, "
                    f"{dtype_name(self.result_dtype)}{fast})")
        return f"{self.op}(" + ", ".join("x".join(map(str, m.size)) or "scalar" for m in self.operands) + ")"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "sizes": [list(o.size) for o in self.operands],
            "strides": [list(o.stride) for o in self.operands],
            "dtypes": [dtype_name(o.dtype) for o in self.operands],
            "device": self.device,
            "alpha": self.alpha,
            "beta": self.beta,
            # scaled_mm's own fields, only there (the other ops' keys are unchanged)
            **({"out_dtype": dtype_name(self.result_dtype), "fast_accum": self.fast_accum, "scales": self.scales}
               if self.op == "scaled_mm" else {}),
        }

    @property
    def problem_key(self) -> str:
        """Stable text key: equal for problems a tuning result can be shared between."""
        body = json.dumps({**self.to_dict(), "device": self.device_type}, sort_keys=True, separators=(",", ":"))
        return f"{self.describe()}/{dtype_name(self.dtype)}/" + hashlib.sha256(body.encode()).hexdigest()[:16]


def place_operands(tensors: Any, device: str | torch.device | None) -> tuple:
    """The operands detached (candidates run on data, not on the autograd graph: NumPy and `out=` refuse
    grad-tracking tensors) and moved to `device` when one is given.

    Example:
        >>> [t.requires_grad for t in place_operands((torch.ones(2, requires_grad=True),), None)]
        [False]
    """
    detach = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in tensors)
    if device is None:
        return detach
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"device: {device!r} is not a device ({exc})") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device: {device!r} requested but CUDA is not available here")
    return tuple(t.to(dev) if isinstance(t, torch.Tensor) else t for t in detach)
