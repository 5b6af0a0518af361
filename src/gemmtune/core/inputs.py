"""KernelInputs: the concrete description of one GEMM problem.

A problem is everything a kernel's speed or result depends on: the op, shapes,
strides, dtypes, device and the addmm scalars.  Two calls with equal
`problem_key` can share a tuning result.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from .errors import InputError

OPS = ("mm", "addmm", "bmm")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> `"bfloat16"`."""
    return str(dtype).replace("torch.", "")


def parse_dtype(name: str) -> torch.dtype:
    """Parse a dtype name (`bf16`, `bfloat16`, `torch.float16`, `fp32`, ...)."""
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16",
               "fp32": "float32", "float": "float32", "fp64": "float64", "double": "float64"}
    key = name.replace("torch.", "").lower()
    key = aliases.get(key, key)
    dtype = getattr(torch, key, None)
    if not isinstance(dtype, torch.dtype) or dtype not in SUPPORTED_DTYPES:
        raise InputError(f"dtype: unsupported dtype {name!r}; use one of "
                         f"{', '.join(dtype_name(d) for d in SUPPORTED_DTYPES)}")
    return dtype


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
    bmm(a, b).  Shapes use M, K, N for C[M, N] = A[M, K] @ B[K, N].

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

    # -- construction -----------------------------------------------------
    @classmethod
    def from_tensors(cls, op: str, *tensors: Any, alpha: float = 1.0, beta: float = 1.0) -> "KernelInputs":
        """Validate `tensors` for `op` and describe them; raises InputError naming the problem."""
        from .validate import validate_operands

        validate_operands(op, tensors, alpha, beta)
        return cls(op, tuple(TensorMeta.of(t) for t in tensors), float(alpha), float(beta))

    # -- shape views ------------------------------------------------------
    @property
    def a(self) -> TensorMeta:
        return self.operands[1] if self.op == "addmm" else self.operands[0]

    @property
    def b(self) -> TensorMeta:
        return self.operands[2] if self.op == "addmm" else self.operands[1]

    @property
    def bias(self) -> TensorMeta | None:
        return self.operands[0] if self.op == "addmm" else None

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
        """Inductor-style `op(AxB, CxD)` listing every operand's size."""
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
