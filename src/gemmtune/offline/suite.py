"""Problems from the command line or a suite file, made into real tensors."""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from ..core.errors import InputError
from ..core.inputs import OPS, KernelInputs, parse_dtype
from .dims import MAX_DIM, MAX_OPERAND_BYTES, check_dims, parse_shape  # noqa: F401 - MAX_* re-exported
from .fp8_spec import check_fp8_spec, fp8_operands, out_dtype_name
MAX_SUITE_BYTES = 16 << 20
"""A suite file larger than this is refused before it is parsed (a suite is a list of shapes)."""


@dataclass(frozen=True)
class ProblemSpec:
    """One GEMM to tune: C[M, N] = A[M, K] @ B[K, N] (per batch for bmm).

    Example:
        >>> ProblemSpec.parse("64x32x16").describe()
        'mm 64x32x16 float32 B=row'
    """

    M: int
    K: int
    N: int
    op: str = "mm"
    batch: int = 1
    dtype: str = "float32"
    b_layout: str = "row"
    name: str = ""
    scales: str = ""  # scaled_mm: "tensorwise" or "rowwise" (offline/fp8_spec.py)
    out_dtype: str = ""  # scaled_mm: bfloat16 (the default, also for ""), float16 or float32
    fast_accum: bool = False  # scaled_mm: torch's use_fast_accum

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise InputError(f"op: unknown op {self.op!r}; expected one of {', '.join(OPS)}")
        if self.b_layout not in ("row", "col"):
            raise InputError(f"b_layout: expected 'row' or 'col', got {self.b_layout!r}")
        check_dims(self.M, self.K, self.N, self.batch)
        if not isinstance(self.dtype, str) or not isinstance(self.name, str):
            raise InputError(f"dtype and name: expected strings, got {self.dtype!r} and {self.name!r}")
        check_fp8_spec(self.op, self.dtype, self.scales, self.b_layout, self.out_dtype, self.fast_accum)
        if self.op == "scaled_mm":  # one spelling, so a spec rebuilt from a dataset record is equal to it
            object.__setattr__(self, "out_dtype", out_dtype_name(self.out_dtype))

    @classmethod
    def parse(cls, shape: str, **kw) -> "ProblemSpec":
        """The spec of `--shape` MxKxN.

        Example:
            >>> ProblemSpec.parse("99999999999999999999x2x2")
            Traceback (most recent call last):
            ...
            gemmtune.core.errors.InputError: shape: M must be at most 2147483647 (2**31 - 1), got 99999999999999999999
        """
        return cls(*parse_shape(shape), **kw)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "ProblemSpec":
        """The spec of a suite shape or a dataset's shape record (its `SHAPE_KEYS`; other keys ignored).

        Example:
            >>> rec = {"op": "scaled_mm", "M": 16, "K": 32, "N": 16, "dtype": "float8_e4m3fn", "b_layout": "col",
            ...        "scales": "tensorwise", "out_dtype": "float32", "fast_accum": True, "choices": []}
            >>> ProblemSpec.from_record(rec).describe()
            'scaled_mm 16x32x16 float8_e4m3fn tensorwise out=float32 fast_accum B=col'
        """
        return cls(**{k: record[k] for k in SHAPE_KEYS if record.get(k) is not None})

    def describe(self) -> str:
        b = f"{self.batch}x" if self.op == "bmm" else ""
        extra = ""
        if self.op == "scaled_mm":  # the output dtype where it is not the default, bfloat16
            out = f" out={self.out_dtype}" if self.out_dtype != "bfloat16" else ""
            extra = f" {self.scales}{out}" + (" fast_accum" if self.fast_accum else "")
        return f"{self.op} {b}{self.M}x{self.K}x{self.N} {self.dtype}{extra} B={self.b_layout}"

    @property
    def tune_kwargs(self) -> dict[str, Any]:
        """The keywords `gemmtune.tune` takes besides the tensors: scaled_mm's `out_dtype` and `use_fast_accum`.

        Example:
            >>> ProblemSpec(16, 32, 16).tune_kwargs
            {}
        """
        if self.op != "scaled_mm":
            return {}
        return {"out_dtype": parse_dtype(self.out_dtype), "use_fast_accum": self.fast_accum}

    def kernel_inputs(self, tensors: tuple[torch.Tensor, ...]) -> KernelInputs:
        """The problem of `tensors` (this spec's, from `tensors()`), as `tune` keys it."""
        kw = self.tune_kwargs
        return KernelInputs.from_tensors(self.op, *tensors, out_dtype=kw.get("out_dtype"),
                                         fast_accum=kw.get("use_fast_accum", False))

    def tensors(self, device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Random normal operands (never zeros: they hide unwritten outputs and time faster)."""
        g = torch.Generator(device="cpu").manual_seed(seed)
        if self.op == "scaled_mm":
            return fp8_operands(self.M, self.K, self.N, self.dtype, self.scales, device, g)
        dtype = parse_dtype(self.dtype)
        lead = (self.batch,) if self.op == "bmm" else ()

        def rnd(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)

        a = rnd(*lead, self.M, self.K)
        b = rnd(*lead, self.N, self.K).transpose(-1, -2) if self.b_layout == "col" else rnd(*lead, self.K, self.N)
        if self.op == "addmm":
            return (rnd(self.N), a, b)
        return (a, b)


SHAPE_KEYS = ("name", "op", "M", "K", "N", "batch", "dtype", "b_layout", "scales", "out_dtype", "fast_accum")
"""The keys of one shape in a suite file; M, K and N are required."""


def load_suite(path: str | Path, dtype: str | None = None) -> list[ProblemSpec]:
    """Read a suite file (the format of bench/shapes.json): `{"shapes": [shape, ...]}` or a list of
    shapes, each an object of `SHAPE_KEYS`.  Anything else is an InputError naming the file and the shape.

    Example:
        >>> import json, tempfile
        >>> f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        >>> _ = f.write(json.dumps([{"M": 8, "K": 4, "N": 16, "op": "addmm"}])); f.close()
        >>> load_suite(f.name)[0].describe()
        'addmm 8x4x16 float32 B=row'
    """
    data = _read_json(path)
    shapes = data.get("shapes") if isinstance(data, dict) else data
    if not isinstance(shapes, list) or not shapes:
        raise InputError(f"--suite: {path} has no 'shapes' list (expected a non-empty list of shape objects)")
    return [_shape(s, i, path, dtype) for i, s in enumerate(shapes)]


def _read_json(path: str | Path) -> Any:
    """The suite file's JSON, read no further than MAX_SUITE_BYTES; InputError naming the file otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SUITE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"--suite: cannot read {path}: {exc}") from exc
    if len(raw) > MAX_SUITE_BYTES:
        raise InputError(f"--suite: cannot read {path}: larger than {MAX_SUITE_BYTES >> 20} MiB "
                         f"(a suite is a list of shapes)")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise InputError(f"--suite: cannot read {path}: its JSON is nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError, json.JSONDecodeError and int's digit limit are ValueErrors
        raise InputError(f"--suite: cannot read {path}: {exc}") from exc


def _shape(s: object, i: int, path: str | Path, dtype: str | None) -> ProblemSpec:
    """Shape #`i` of a suite file as a ProblemSpec; InputError naming the file, the shape and the problem."""
    where = f"--suite: shape #{i} in {path}"
    if not isinstance(s, dict):
        raise InputError(f"{where}: expected an object with M, K and N, got {type(s).__name__} {reprlib.repr(s)}")
    unknown = sorted(str(k) for k in s if k not in SHAPE_KEYS)
    if unknown:
        raise InputError(f"{where}: unknown key {', '.join(map(reprlib.repr, unknown[:5]))}"
                         f"{', ...' if len(unknown) > 5 else ''}; known keys: {', '.join(SHAPE_KEYS)}")
    missing = [k for k in ("M", "K", "N") if k not in s]
    if missing:
        raise InputError(f"{where} lacks {', '.join(map(repr, missing))}")
    for key in ("M", "K", "N", "batch"):
        v = s.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{where}: {key} must be a positive integer, got {reprlib.repr(v)}")
    for key in ("name", "op", "dtype", "b_layout", "scales", "out_dtype"):
        if key in s and not isinstance(s[key], str):
            raise InputError(f"{where}: {key} must be a string, got {reprlib.repr(s[key])}")
    op = s.get("op", "mm")
    if "batch" in s and op != "bmm":
        raise InputError(f"{where}: batch belongs to bmm only, and this shape's op is {op!r} (drop the batch, "
                         f"or give \"op\": \"bmm\")")
    fp8 = op == "scaled_mm"
    try:
        return ProblemSpec(M=s["M"], K=s["K"], N=s["N"], op=op, batch=s.get("batch", 1),
                           dtype=dtype or s.get("dtype", "float8_e4m3fn" if fp8 else "float32"),
                           b_layout=s.get("b_layout", "col" if fp8 else "row"), name=s.get("name", f"shape-{i}"),
                           scales=s.get("scales", "tensorwise" if fp8 else ""), out_dtype=s.get("out_dtype", ""),
                           fast_accum=s.get("fast_accum", False))
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
