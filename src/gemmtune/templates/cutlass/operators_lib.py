"""What the `cutlass_operators` template asks of `cutlass.operators` (nvidia-cutlass-operators 0.3).

Everything that touches the library is here, each function taking the library module `lib` as its
first argument, so that tests/test_cutlass_operators.py runs it against a small fake shaped like the
library's API.  The library is imported by `load()` only.

- `operators(lib, ki, target)`: `lib.get_operators(GemmArguments(A, B, out, float32[, epilogue]),
  target_sm=target)` on meta tensors with the problem's layouts (discovery reads only dtypes, strides
  and alignment).  For addmm it first asks with the bias epilogue (`EpilogueArguments`); where no
  operator fuses it (every Hopper operator of 0.3.0: epilogue fusion is SM100 only) it asks without.
- `config_of(op, epilogue)`: an operator's compile-time config: class name, design (tile, cluster,
  stages), and whether the bias is fused or added after the GEMM.
- `identity(op)`: module, class and design, the operator's part of a choice's `src_hash`.
- `compiled(lib, op, args, key, src_hash, arch)`: `op.compile(args)`, kept on disk with the DSL's
  `export_to_c` and read back with `cutlass.runtime.load_module` (`disk`), wrapped in the library's
  `CompiledArtifact` so that `op.run(args, artifact)` runs a loaded kernel as a compiled one; a
  kernel a compile process is building (`parallel`) is waited for and loaded.
- `job_for(cfg, ki, example, path, target)` and `compile_job(job)`: what a compile process needs to
  build one operator's kernel, and the build itself (kind "operators" of `compile_process`).

Example:
    >>> BIAS_EPILOGUE.splitlines()[0]
    'def bias_epilogue(accum, alpha, C, beta):'
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch

from ...core.inputs import KernelInputs
from ..base import split_operands
from . import disk
from .tracing import DSL_COMPILE_LOCK

log = logging.getLogger("gemmtune.templates.cutlass")
# the library compiles with the DSL's `cute.compile`, whose tracing is not thread-safe: a tune's compile
# threads build one kernel at a time, under the DSL's one lock (loads from disk need none)
_COMPILE_LOCK = DSL_COMPILE_LOCK

PREFIX = "gemmtune_operator"  # the exported function's symbol (one function per file)
BIAS_EPILOGUE = "def bias_epilogue(accum, alpha, C, beta):\n    D = (accum * alpha) + (C * beta)\n    return D\n"
"""addmm's epilogue in the library's epilogue-fusion language (parsed by the library, never run here)."""


def load() -> Any:
    """The library module, `cutlass.operators` (raises ImportError without it)."""
    import cutlass.operators as lib

    return lib


def _meta(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype, device="meta")


def problem_tensors(ki: KernelInputs, device: str = "meta") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A, B and a row-major out with `ki`'s shapes and strides (meta tensors: no memory).

    Example:
        >>> ki = KernelInputs.from_tensors("mm", torch.ones(8, 16), torch.ones(32, 16).t())
        >>> [t.stride() for t in problem_tensors(ki)]
        [(16, 1), (1, 16), (32, 1)]
    """
    a = torch.empty_strided(ki.a.size, ki.a.stride, dtype=ki.dtype, device=device)
    b = torch.empty_strided(ki.b.size, ki.b.stride, dtype=ki.dtype, device=device)
    return a, b, torch.empty(ki.out_size, dtype=ki.dtype, device=device)


def bias_view(bias: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """addmm's bias as the epilogue's C operand: broadcast to `out`'s shape (a view, no copy)."""
    return bias.expand_as(out)


def gemm_arguments(lib: Any, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                   bias: torch.Tensor | None = None, alpha: float = 1.0, beta: float = 1.0) -> Any:
    """`lib.GemmArguments` for out = A @ B (fp32 accumulator), with the bias epilogue where `bias` is given."""
    epilogue = None
    if bias is not None:
        epilogue = lib.EpilogueArguments(BIAS_EPILOGUE, alpha=float(alpha), C=bias_view(bias, out),
                                         beta=float(beta), D=out)
    return lib.GemmArguments(a, b, out, torch.float32, epilogue=epilogue)


def operators(lib: Any, ki: KernelInputs, target: str) -> tuple[list[Any], str]:
    """The operators the library offers for `ki` on `target` ("90a"), and the epilogue they take:
    "none" (mm, bmm), "fused" (addmm's bias in the library's epilogue) or "separate" (addmm where no
    operator fuses it: the bias is added after the GEMM)."""
    a, b, out = problem_tensors(ki)
    if ki.op == "addmm" and ki.beta != 0.0:
        bias = _meta(ki.bias.size, ki.bias.stride, ki.dtype) if ki.bias is not None else None
        if bias is not None and bias.dim() <= out.dim():
            try:
                fused = lib.get_operators(gemm_arguments(lib, a, b, out, bias, ki.alpha, ki.beta), target_sm=target)
            except (ValueError, TypeError, NotImplementedError) as exc:
                log.debug("cutlass_operators: no fused bias epilogue for %s (%s)", ki.describe(), exc)
                fused = []
            if fused:
                return list(fused), "fused"
        return list(lib.get_operators(gemm_arguments(lib, a, b, out), target_sm=target)), "separate"
    return list(lib.get_operators(gemm_arguments(lib, a, b, out), target_sm=target)), "none"


def config_of(op: Any, epilogue: str) -> dict[str, Any]:
    """The compile-time config of `op`: class, tile, cluster, stages (0: the operator picks them) and epilogue.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> design = NS(tile_shape=(128, 256, 64), cluster_shape=(2, 1, 1), num_smem_stages=None)
        >>> class Sm90Op: metadata = NS(design=design)
        >>> config_of(Sm90Op(), "none")["tile_n"], config_of(Sm90Op(), "none")["stages"]
        (256, 0)
    """
    d = op.metadata.design
    tm, tn, tk = d.tile_shape
    cm, cn, _ = d.cluster_shape
    return dict(operator=type(op).__name__, tile_m=tm, tile_n=tn, tile_k=tk, cluster_m=cm, cluster_n=cn,
                stages=d.num_smem_stages or 0, epilogue=epilogue)


def identity(op: Any) -> str:
    """The operator's identity: its module, class and design (the library's own description of it)."""
    return f"{type(op).__module__}.{type(op).__qualname__}:{op.metadata.design!r}"


def matches(op: Any, cfg: Mapping[str, Any]) -> bool:
    """Whether `op` is the operator of `cfg` (the keys `config_of` writes; others are ignored)."""
    mine = config_of(op, cfg.get("epilogue", "none"))
    return all(cfg.get(k) == v for k, v in mine.items())


def _save(fn: Any, path: Path) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            fn.export_to_c(str(Path(tmp) / "kernel.o"), function_name=PREFIX)
            os.replace(Path(tmp) / "kernel.o", path)
        return True
    except Exception as exc:  # noqa: BLE001 - not kept: the next process compiles it again
        log.info("gemmtune: cutlass_operators: compiled kernel not kept on disk (%s: %s)", type(exc).__name__, exc)
        return False


def _load(path: Path, tvm_ffi: bool) -> Any | None:
    if not path.is_file():
        return None
    try:
        from cutlass.runtime import load_module

        return getattr(load_module(str(path), enable_tvm_ffi=tvm_ffi), PREFIX)
    except Exception as exc:  # noqa: BLE001 - a bad file costs a compile, never a failure
        log.info("gemmtune: cutlass_operators: kept kernel %s did not load (%s: %s); compiling it again",
                 path.name, type(exc).__name__, exc)
        return None


def keeps_on_disk(lib: Any) -> bool:
    """Whether compiled kernels go to disk: with TVM-FFI (the library's default where apache-tvm-ffi
    is installed; its compiled functions export to C) and the disk on (`disk.enabled`)."""
    return bool(lib.GlobalOptions().use_tvm_ffi) and disk.enabled()


def kernel_path(key: tuple, src_hash: str, target: str) -> Path:
    """Where the kernel of `key` (`launch.disk_key`) and `src_hash` is kept (`disk.kernel_path`).

    Example:
        >>> p = kernel_path(("k",), "h", "90a")
        >>> p.parent.name, p != kernel_path(("k",), "h", "100a")
        ('cutedsl_kernels', True)
    """
    return disk.kernel_path(("operators", key), src_hash, target)


DIRECT_OPERATORS = frozenset({"Sm90StaticPersistentGemmOperator"})
"""Operators whose `run` (0.3.0's `_run`) calls the compiled kernel as `kernel(A, B, out, stream)`."""
DIRECT_VERSIONS = ("0.3.",)
"""Library versions whose run was read to be that call (another may pass other arguments, which a
kernel could read as a fault on the device rather than a Python error)."""


def direct_kernel(lib: Any, op: Any, artifact: Any, fused: bool) -> Any | None:
    """The compiled kernel, to call as `kernel(a, b, out, stream)` with torch tensors instead of
    `op.run(GemmArguments(a, b, out, ...), artifact, stream)`: with TVM-FFI on, those arguments hand
    the kernel the torch tensors themselves, after building compile-time descriptions the compiled
    artifact no longer needs.  None where the call differs: a fused epilogue (more arguments), TVM-FFI
    off (the arguments convert tensors through DLPack), an operator not in `DIRECT_OPERATORS`, or a
    library version not in `DIRECT_VERSIONS`."""
    if (fused or type(op).__name__ not in DIRECT_OPERATORS or not bool(lib.GlobalOptions().use_tvm_ffi)
            or not str(getattr(lib, "__version__", "")).startswith(DIRECT_VERSIONS)):
        return None
    return getattr(artifact, "compiled_obj", None)


def compiled(lib: Any, op: Any, args: Any, key: tuple, src_hash: str, target: str) -> Any:
    """`op.compile(args, target_sm=target)`, or the artifact of an earlier process (or of a compile
    process, waited for) from disk: a `lib.CompiledArtifact` around the loaded function.  Kept on
    disk only where `keeps_on_disk(lib)`."""
    if not keeps_on_disk(lib):
        with _COMPILE_LOCK:
            return op.compile(args, target_sm=target)
    from . import parallel

    path = kernel_path(key, src_hash, target)
    why = parallel.wait(str(path))
    if why not in (None, "not pending"):
        log.info("gemmtune: cutlass_operators: compile process: %s; compiling here", why)
    kept = _load(path, True)
    if kept is not None:
        return lib.CompiledArtifact(compiled_obj=kept, operator_obj=op, compiled_for=lib.TargetSm(target))
    with _COMPILE_LOCK:
        artifact = op.compile(args, target_sm=target)
    _save(artifact.compiled_obj, path)
    return artifact


def job_for(cfg: Mapping[str, Any], ki: KernelInputs, example: Any, path: Path, target: str) -> dict | None:
    """What a compile process needs to build the kernel of `cfg` for `ki` into `path` (`compile_job`);
    None when the disk has it already."""
    if path.is_file():
        return None
    return {"kind": "operators", "path": str(path), "cfg": dict(cfg), "target": target, "op": ki.op,
            "dtype": str(ki.dtype).removeprefix("torch."), "alpha": float(ki.alpha), "beta": float(ki.beta),
            "device": example[-1].device.type, "operands": [[list(t.shape), list(t.stride())] for t in example]}


def compile_job(job: Mapping[str, Any]) -> None:
    """In a compile process: find `job`'s operator for operands of its shapes, strides and device type
    (contents unset), compile it and keep it at `job["path"]`; raises if it could not be kept."""
    lib = load()
    device, dtype = torch.device(job["device"]), getattr(torch, job["dtype"])
    tensors = [torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride in job["operands"]]
    ki = KernelInputs.from_tensors(job["op"], *tensors, alpha=job["alpha"], beta=job["beta"])
    cfg, target = job["cfg"], job["target"]
    op = next((o for o in operators(lib, ki, target)[0] if matches(o, cfg)), None)
    if op is None:
        raise ValueError(f"no operator of the library matches {cfg} for {ki.describe()}")
    fused = cfg.get("epilogue") == "fused"
    bias, a, b = split_operands(ki, tensors)
    out = torch.empty(ki.out_size, dtype=dtype, device=device)
    args = gemm_arguments(lib, a, b, out, bias if fused else None, ki.alpha, ki.beta)
    artifact = op.compile(args, target_sm=target)
    if not (keeps_on_disk(lib) and _save(artifact.compiled_obj, Path(job["path"]))):
        raise RuntimeError("compiled, but it could not be kept on disk")
