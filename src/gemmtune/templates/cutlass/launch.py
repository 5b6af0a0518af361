"""The launcher of one `cutlass_operators` choice: the library's `Operator.run` on a compiled artifact.

Per call it builds the library's `GemmArguments` for the call's tensors and runs
`op.run(args, artifact, stream, assume_supported_args=True)` on torch's current stream.  The arguments
are built on every call, also when the tensors are the same as last time: a dispatched call gets a
new output tensor each time, so it always pays for them (332-380 us of host time per call on the
H200 host, against 18 us with the arguments kept, 2026-12-01), and a
launcher that kept them would be timed at a host cost no real call has.  On that host a tune that
timed the kept arguments picked an operator for a 4097x4096x4096 mm at 0.181 ms of GPU time against
cuBLAS's 0.185 ms, whose calls then took 0.39 ms each on the host.  With `direct=True` (the
template's default) an operator whose run is its kernel's call takes the tensors straight
(`operators_lib.direct_kernel`), without the arguments: 16-21 us of host time per call on the H200
against 415-428 us (2026-12-01).  Each launcher checks that on its first call: the library's run
computes the output, the kernel's own call writes a second one, and only where the two agree bit
for bit (NaNs included) do later calls take the direct path (`agreeing`); a kernel that raises or
differs keeps the library's run, with a log line.  addmm adds
the bias after the GEMM where the operator does not fuse it (`bias_after`); alpha 0 runs no
GEMM (`base.bias_only`).

Example:
    >>> bias_after(torch.zeros(1, 2), torch.tensor([1.0, 2.0]), 1.0, 1.0).tolist()
    [[1.0, 2.0]]
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Mapping, Sequence

import torch

from ...core.inputs import KernelInputs
from ..base import Launcher, bias_only, split_operands
from . import operators_lib

log = logging.getLogger("gemmtune")


def disk_key(cfg: Mapping[str, Any], ki: KernelInputs, target: str) -> tuple:
    """What a compiled operator depends on besides its `src_hash`: config, dtype, op, operand layouts,
    the target and the GPU's SM count (the max-active-clusters bound is traced in)."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count \
        if torch.cuda.is_available() else 0
    layouts = tuple(t.stride.index(min(t.stride)) if t.stride else None for t in ki.operands)
    return (tuple(sorted(cfg.items())), str(ki.dtype), ki.op, len(ki.a.size), layouts, target, sms)


def bias_after(out: torch.Tensor, bias: torch.Tensor | None, alpha: float, beta: float) -> torch.Tensor:
    """addmm's `alpha * out + beta * bias`, in place, after an unfused GEMM wrote `out = A @ B`.

    Example:
        >>> bias_after(torch.ones(2, 2), torch.tensor([1.0, 2.0]), 2.0, 1.0).tolist()
        [[3.0, 4.0], [3.0, 4.0]]
    """
    if alpha != 1.0:
        out.mul_(alpha)
    if bias is not None and beta != 0.0:
        out.add_(bias, alpha=beta)
    return out


def agreeing(kernel: Any, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, stream: Any,
             problem: str) -> Any | None:
    """`kernel` if its own call `kernel(a, b, probe, stream)` writes what the library's run wrote into
    `out`, bit for bit; else None (the library's run stays), with a log line.

    Example:
        >>> a, b = torch.ones(2, 3), torch.ones(3, 2)
        >>> good = lambda a, b, out, stream: out.copy_(a @ b)
        >>> agreeing(good, a, b, a @ b, None, "mm") is good, agreeing(lambda *x: None, a, b, a @ b, None, "mm")
        (True, None)
    """
    try:
        probe = torch.full_like(out, float("nan"))  # a second output: out holds the library's result
        kernel(a, b, probe, stream)
        same = torch.equal(_bits(probe), _bits(out))
    except Exception as exc:  # noqa: BLE001 - the direct call is refused: the library's run stays
        log.info("gemmtune: cutlass_operators: %s: the kernel's own call failed (%s: %s); using the library's run",
                 problem, type(exc).__name__, exc)
        return None
    if not same:
        log.warning("gemmtune: cutlass_operators: %s: the kernel's own call differs from the library's run; "
                    "using the library's run", problem)
        return None
    return kernel


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s elements as integers of the same width (so NaNs compare equal to themselves)."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def launcher(lib: Any, op: Any, cfg: Mapping[str, Any], ki: KernelInputs, example: Sequence[torch.Tensor],
             src_hash: str, target: str, direct: bool = True) -> Launcher:
    """Compile `op` against `example` (or load it from disk) and return `launch(tensors, out=None)`;
    `direct`: call the compiled kernel itself where `operators_lib.direct_kernel` allows it."""
    fused = cfg.get("epilogue") == "fused"
    alpha, beta = float(ki.alpha), float(ki.beta)
    bias0, a0, b0 = split_operands(ki, example)
    out0 = torch.empty(ki.out_size, dtype=ki.dtype, device=a0.device)
    args0 = operators_lib.gemm_arguments(lib, a0, b0, out0, bias0 if fused else None, alpha, beta)
    artifact = operators_lib.compiled(lib, op, args0, disk_key(cfg, ki, target), src_hash, target)
    kernel = operators_lib.direct_kernel(lib, op, artifact, fused) if direct else None
    checked, checking = kernel is None, threading.Lock()  # one first-call check, whichever thread calls first

    def launch(tensors: Sequence[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        nonlocal kernel, checked
        bias, a, b = split_operands(ki, tensors)
        if out is None:
            out = torch.empty(ki.out_size, dtype=ki.dtype, device=a.device)
        if ki.op == "addmm" and alpha == 0.0:
            return bias_only(out, bias if beta != 0.0 else None, beta)
        stream = torch.cuda.current_stream() if out.is_cuda else None
        if kernel is not None and checked:
            kernel(a, b, out, stream)
        else:
            args = operators_lib.gemm_arguments(lib, a, b, out, bias if fused else None, alpha, beta)  # see above
            op.run(args, artifact, stream=stream, assume_supported_args=True)
            if not checked and not (out.is_cuda and torch.cuda.is_current_stream_capturing()):
                with checking:
                    if not checked:
                        kernel = agreeing(kernel, a, b, out, stream, ki.describe())
                        checked = True
        if ki.op == "addmm" and not fused:
            bias_after(out, bias, alpha, beta)
        return out

    return launch
