"""Library ("extern") kernels: aten (cuBLAS / oneDNN) and NumPy BLAS.

Their `src_hash` is None: they have no source of ours to hash.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..core.choices import Choice
from ..core.inputs import KernelInputs
from .base import Launcher, Template, bias_only, split_operands


class AtenTemplate(Template):
    """torch.mm / torch.addmm / torch.bmm: cuBLAS on GPU, oneDNN/MKL on CPU."""

    family = "extern"
    traceable = True  # its launcher is the aten op itself

    def __init__(self, op: str):
        self.op = op
        self.uid = f"aten_{op}"

    def supports(self, ki: KernelInputs) -> bool:
        return ki.op == self.op

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        alpha, beta = ki.alpha, ki.beta

        def launch(tensors, out=None):
            if ki.op == "mm":
                return torch.mm(tensors[0], tensors[1], out=out)
            if ki.op == "bmm":
                return torch.bmm(tensors[0], tensors[1], out=out)
            bias = tensors[0].expand(ki.M, ki.N)
            return torch.addmm(bias, tensors[1], tensors[2], beta=beta, alpha=alpha, out=out)

        if ki.op in ("mm", "bmm"):  # bound to a problem (`launch.bound`): torch's op itself
            setattr(launch, "bound", lambda tensors: torch.mm if ki.op == "mm" else torch.bmm)
        else:
            setattr(launch, "bound", lambda tensors: _bound_addmm(ki.M, ki.N, alpha, beta))
        return launch

    def trace(self, choice: Choice, ki: KernelInputs) -> Launcher:
        return self.compile(choice, ki, ())


def _bound_addmm(m: int, n: int, alpha: float, beta: float) -> Launcher:
    """`AtenTemplate`'s addmm bound to its problem: the bias expanded to the output's size, as its launcher
    passes it (cuBLAS, not cuBLASLt's bias epilogue), with the scalars named only where they are not 1.

    Example:
        >>> run = _bound_addmm(2, 3, 1.0, 0.5)
        >>> run(torch.ones(3), torch.ones(2, 4), torch.ones(4, 3)).tolist()
        [[4.5, 4.5, 4.5], [4.5, 4.5, 4.5]]
    """
    scalars = {} if alpha == 1.0 and beta == 1.0 else {"beta": beta, "alpha": alpha}

    def run(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return torch.addmm(bias.expand(m, n), a, b, out=out, **scalars)

    setattr(run, "any_layout", True)  # torch's op: any layout of the operands, bias and output of its size
    return run


class AtenBiasAddmmTemplate(Template):
    """addmm with a row-vector bias passed unexpanded, so cuBLASLt fuses it as an epilogue."""

    uid = "aten_bias_addmm"
    family = "extern"
    traceable = True

    def supports(self, ki: KernelInputs) -> bool:
        bias = ki.bias
        return (ki.op == "addmm" and ki.device_type == "cuda" and bias is not None
                and ki.alpha == 1.0 and ki.beta == 1.0
                and (len(bias.size) == 1 or (len(bias.size) == 2 and bias.size[0] == 1)))

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        def launch(tensors, out=None):
            bias = tensors[0].reshape(-1).expand(ki.N)
            return torch.addmm(bias, tensors[1], tensors[2], out=out)

        # bound to a problem: torch's addmm itself where the bias is already a vector of N
        setattr(launch, "bound", lambda tensors: torch.addmm if tensors[0].dim() == 1 else None)
        return launch

    def trace(self, choice: Choice, ki: KernelInputs) -> Launcher:
        return self.compile(choice, ki, ())


def contiguous_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """`bias` as torch's `_scaled_mm` reads it right: a strided 1-D view copied to contiguous memory
    (N elements), anything else as it is.

    Example:
        >>> b = torch.arange(8.0)[::2]
        >>> contiguous_bias(b).is_contiguous(), torch.equal(contiguous_bias(b), b), contiguous_bias(None)
        (True, True, None)
    """
    if bias is None or bias.is_contiguous():
        return bias
    return bias.contiguous()


class AtenScaledMMTemplate(Template):
    """`torch._scaled_mm`: cuBLASLt on GPU, torch's own kernel on CPU; the library kernel of scaled_mm.

    Its launcher passes the problem's `out_dtype` and `use_fast_accum` (the flag is part of the problem:
    a fast-accumulating kernel competes only where the caller asked for it), and a strided 1-D bias as
    a contiguous copy: torch 2.11's cuBLASLt path reads a bias view `x[::2]` as if it were contiguous
    (relative error 0.16-0.19 on an H200, found by `bench/fuzz.py --kind fp8`)."""

    uid = "aten_scaled_mm"
    family = "extern"
    ops = ("scaled_mm",)

    def supports(self, ki: KernelInputs) -> bool:
        return ki.op == "scaled_mm"

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        out_dtype, fast = ki.result_dtype, ki.fast_accum

        def launch(tensors, out=None):
            a, b, scale_a, scale_b = tensors[:4]
            bias = contiguous_bias(tensors[4]) if len(tensors) > 4 else None
            if out is None:
                return torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, use_fast_accum=fast)
            return torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, use_fast_accum=fast,
                                    out=out)

        return launch


class NumpyTemplate(Template):
    """NumPy's matmul (its BLAS: OpenBLAS or MKL) on CPU float32/float64.

    Its own family ("numpy"), opt-in: only a `backends` naming "numpy" pools it.  It runs on NumPy's
    BLAS thread pool, not torch's, and the two fight over the cores: next to torch's ops (a model's
    LayerNorm, another layer) a pick as fast as aten alone took 10x its time, and in an interleaved
    final the kernel timed after it is the one that pays (torch.mm 512^3 read 3.4 ms there against
    1.4 ms alone), so it would win by the other's loss (docs/ARCHITECTURE.md)."""

    uid = "numpy_blas"
    family = "numpy"
    native_devices = ("cpu",)
    opt_in = True  # pooled only where `backends` names "numpy" or `templates=` lists it (see above)

    def supports(self, ki: KernelInputs) -> bool:
        return ki.device_type == "cpu" and ki.dtype in (torch.float32, torch.float64)

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        alpha, beta = ki.alpha, ki.beta

        def launch(tensors, out=None):
            bias, a, b = split_operands(ki, tensors)
            if out is None:
                out = torch.empty(ki.out_size, dtype=ki.dtype)
            if alpha == 0.0:  # torch.addmm's semantics: A @ B is not computed (its NaN/Inf do not propagate)
                return bias_only(out, bias if beta != 0.0 else None, beta)
            o = out.detach().numpy()
            # NaN and Inf are data: torch.mm computes them without a word, so NumPy's "invalid value"
            # and "overflow" warnings are silenced for this call (errstate is scoped to it and this thread).
            with np.errstate(invalid="ignore", over="ignore"):
                np.matmul(a.detach().numpy(), b.detach().numpy(), out=o)
                if bias is not None:
                    if alpha != 1.0:
                        o *= alpha
                    if beta != 0.0:
                        o += beta * bias.detach().numpy()
            return out

        return launch
