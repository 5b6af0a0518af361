"""The shared base of the Triton templates: `TritonTemplate` and the helpers every template uses.

Each template (`mm`, `splitk`, `skinny`, `gemv`, `tma`) is one small module beside its
`@triton.jit` source (`*_kernel.py`, built on the device functions of `common_kernel.py`).  The
templates import what they share from here, never from each other: the support checks, the
source hash, compiling and loading a binary with its direct launch path (`KernelLaunch`), the
kernel arguments (batch strides, bias, epilogue flags, input precision) and the resource limits
the configs are fitted to (shared memory, accumulator registers).

Example:
    >>> cdiv(10, 4), pipeline_smem(stages=3, bm=128, bn=128, bk=64, elt_bytes=2)
    (3, 98304)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

import torch

from ...core.inputs import KernelInputs
from ...core.choices import Choice
from ..binaries import BinaryFiles, report
from ..base import Launcher, Template, pow2_at_least, source_hash, split_operands, unique_configs
from . import key_cache
from .launch import FastLaunch

SPACE_SIZES = ("default", "max")
"""Named sizes of every compile-time space: `config_space(size)`, `Template(size=...)`."""

SWIZZLES = (1, 2, 4, 8)
"""Values of the runtime tile swizzle (GROUP_M) of the tiled templates."""

# Stage-1 swizzle for prescreening: on the recorded H200 replay data (docs/ARCHITECTURE.md,
# 26 shapes) swizzle 8 kept the exhaustive winner in the top 5 on every shape,
# while swizzle 1 or 2 lost 1.6% on one odd shape.
STAGE1_SWIZZLE = 8

DEFAULT_SMEM = 232_448  # Hopper's opt-in shared memory per block: the spaces are pruned against it
ACC_REGS_MAX = 128  # fp32 accumulator registers per thread; beyond it the accumulator spills
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")
COMMON_KERNEL_FILE = Path(__file__).with_name("common_kernel.py")


def triton_available() -> bool:
    """Whether Triton is installed (its import is left to the first compile)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (`TRITON_INTERPRET=1`: CPU tensors, no compile)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as `tl.cdiv`."""
    return (a + b - 1) // b


def kernel_hash(kernel_file: str | Path) -> str:
    """A Triton template's `src_hash`: sha256 of its kernel file and of `common_kernel.py`, whose
    device functions every kernel inlines (a change to either retires the stored timings).

    Example:
        >>> kernel_hash("mm_kernel.py") == source_hash(Path(__file__).with_name("mm_kernel.py"), COMMON_KERNEL_FILE)
        True
    """
    return source_hash(Path(__file__).with_name(str(kernel_file)), COMMON_KERNEL_FILE)


def check_size(size: str) -> None:
    """Raise ValueError unless `size` names a compile-time space (`SPACE_SIZES`)."""
    if size not in SPACE_SIZES:
        raise ValueError(f"config_space: unknown size {size!r}; expected one of {', '.join(SPACE_SIZES)}")


# -- resource limits ----------------------------------------------------------------------------------


def smem_limit(device: str) -> int:
    """Shared memory one block may opt into on `device`; `DEFAULT_SMEM` off a CUDA device."""
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        return int(getattr(props, "shared_memory_per_block_optin", DEFAULT_SMEM))
    return DEFAULT_SMEM


def pipeline_smem(stages: int, bm: int, bn: int, bk: int, elt_bytes: int = 2) -> int:
    """Shared memory of a `stages`-deep pipeline of A (bm x bk) and B (bk x bn) tiles, in bytes."""
    return stages * (bm + bn) * bk * elt_bytes


def acc_regs(bm: int, bn: int, warps: int) -> int:
    """fp32 accumulator registers per thread of a bm x bn tile over `warps` warps (`ACC_REGS_MAX`)."""
    return bm * bn // (32 * warps)


def fit_tiles(space: Iterable[Mapping[str, int]], M: int, N: int, K: int, elt_bytes: int,
              smem: int) -> list[dict[str, int]]:
    """Clamp BLOCK_M/N/K to the problem (powers of two, at least 16), drop duplicates, configs over
    `smem` bytes of shared memory and 8 warps on tiles too small to keep them busy.

    Example:
        >>> fit_tiles([dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_stages=3, num_warps=4)], 5, 100, 40, 2, DEFAULT_SMEM)
        [{'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 64, 'num_stages': 3, 'num_warps': 4}]
    """
    cap_m, cap_n, cap_k = (max(16, pow2_at_least(d)) for d in (M, N, K))
    fitted = []
    for cfg in space:
        c = dict(cfg, BLOCK_M=min(cfg["BLOCK_M"], cap_m), BLOCK_N=min(cfg["BLOCK_N"], cap_n),
                 BLOCK_K=min(cfg["BLOCK_K"], cap_k))
        if pipeline_smem(c["num_stages"], c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], elt_bytes) > smem:
            continue
        if c["BLOCK_M"] * c["BLOCK_N"] < 32 * 32 * 2 and c["num_warps"] > 4:
            continue
        fitted.append(c)
    return unique_configs(fitted)


# -- kernel arguments -------------------------------------------------------------------------------


def input_precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input precision: tf32 for fp32 where torch allows it for matmuls, else ieee."""
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return "ieee"


def epilogue_flags(ki: KernelInputs) -> dict[str, bool]:
    """The kernels' HAS_BIAS and SCALED: whether addmm's beta * bias and alpha terms are needed."""
    return dict(HAS_BIAS=ki.op == "addmm" and ki.beta != 0.0, SCALED=ki.op == "addmm" and ki.alpha != 1.0)


def batch_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, row, column) strides; batch stride 0 for a 2-D tensor."""
    s = t.stride()
    return (s[0], s[1], s[2]) if t.dim() == 3 else (0, s[0], s[1])


def bias_args(bias: torch.Tensor | None, out: torch.Tensor, M: int, N: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """(bias pointer, its (row, column) strides broadcast to M x N); without a bias, `out` with
    strides (0, 0): the kernel never reads it (HAS_BIAS is off) but needs a pointer."""
    if bias is None:
        return out, (0, 0)
    row, col = bias.expand(M, N).stride()
    return bias, (row, col)


def gemm_args(ki: KernelInputs, tensors: Sequence[torch.Tensor], out: torch.Tensor) -> tuple:
    """`(A, B, C, BIAS, M, N, K, A's, B's and C's batch strides, BIAS's 2 strides, alpha, beta)`:
    the leading runtime arguments of the mm, skinny and gemv kernels."""
    bias, a, b = split_operands(ki, tensors)
    bias, sbias = bias_args(bias, out, ki.M, ki.N)
    return (a, b, out, bias, ki.M, ki.N, ki.K, *batch_strides(a), *batch_strides(b), *batch_strides(out), *sbias,
            ki.alpha, ki.beta)


def output(ki: KernelInputs, tensors: Sequence[torch.Tensor], out: torch.Tensor | None) -> torch.Tensor:
    """`out`, or a new row-major output (of the result dtype: scaled_mm's `out_dtype`) on the operands' device."""
    if out is not None:
        return out
    return torch.empty(ki.out_size, dtype=ki.result_dtype, device=tensors[-1].device)


# -- compiling and launching --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """One Triton kernel with its grid and compile-time arguments: `run(args)` launches it through
    `fast` (the direct path, `FastLaunch`) when that serves `args`, else through Triton's JIT.

    Example:
        >>> KernelLaunch(None, (1, 1, 1), {}).fast is None
        True
    """

    kernel: Any
    grid: tuple[int, ...]
    meta: Mapping[str, Any]
    fast: FastLaunch | None = None

    def warmed(self, args: Sequence[Any]) -> "KernelLaunch":
        """This launch with its binary compiled for `args` and loaded, and its direct path built."""
        key_cache.ensure()  # Triton's hash of itself, kept across processes
        compiled = self.kernel.warmup(*args, grid=self.grid, **self.meta)
        # Loading the binary is where shared-memory / register overflows surface.
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()
        _report_files(compiled)
        return dataclasses.replace(self, fast=FastLaunch.build(self.kernel, compiled, self.grid, self.meta, args))

    def __call__(self, args: Sequence[Any]) -> None:
        if self.fast is None or not self.fast(args):
            self.kernel[self.grid](*args, **self.meta)


def _report_files(compiled: Any) -> None:
    """Report a compiled kernel's files in Triton's cache (`templates.binaries`), under the cache's key
    for it: the name of the directory its files are in."""
    group = getattr(compiled, "metadata_group", None)
    if group:
        report(BinaryFiles(Path(next(iter(group.values()))).parent.name, dict(group)))


def warmed(ki: KernelInputs, example: Sequence[torch.Tensor], make_args: Callable[[torch.Tensor], Sequence[tuple]],
           *runs: KernelLaunch) -> tuple[KernelLaunch, ...]:
    """`runs` compiled and loaded now for the example call (`make_args(out)` gives each one's
    arguments), so compile errors and resource overflows surface at compile time, not at the
    first launch.  Under the interpreter, which compiles nothing, `runs` as they are.

    Example:
        >>> run = KernelLaunch(None, (1, 1, 1), {})
        >>> not interpreting() or warmed(None, [], lambda out: [()], run) == (run,)
        True
    """
    if interpreting():
        return runs
    device = example[-1].device
    out = torch.empty(ki.out_size, dtype=ki.result_dtype, device=device)
    with torch.cuda.device(device):
        return tuple(run.warmed(args) for run, args in zip(runs, make_args(out)))


def swizzled_launcher(ki: KernelInputs, example: Sequence[torch.Tensor], run: KernelLaunch,
                      args: Callable[[Sequence[torch.Tensor], torch.Tensor, int], tuple],
                      before: Callable[[], None] | None = None,
                      buffers: Callable[[torch.device], tuple] | None = None,
                      fits: Callable[[torch.Tensor], bool] | None = None) -> Callable[..., torch.Tensor]:
    """The launcher of a one-kernel template with a runtime swizzle: `launch(tensors, out=None,
    swizzle=STAGE1_SWIZZLE)` runs `run` on `args(tensors, out, swizzle)`.  `run` is compiled and
    loaded now (`warmed`, from the example call).  `launch.bound(tensors, swizzle)` is the launcher
    bound to one problem (`bound_launcher`); `before()` runs before each of its launches (what
    `args` does per call besides building arguments, e.g. installing an allocator), and
    `buffers(device)` gives the scratch tensors `args` passes besides the operands and the output.
    `fits(out)`: whether the binary writes `out` as given (its rows' alignment); one it does not is
    computed into a new row-major output and copied over.

    Example:
        >>> import os, unittest.mock
        >>> with unittest.mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}):  # nothing to compile
        ...     launch = swizzled_launcher(None, [], KernelLaunch(None, (1,), {}), lambda t, out, s: ())
        >>> callable(launch)
        True
    """
    run, = warmed(ki, example, lambda out: [args(example, out, STAGE1_SWIZZLE)], run)

    def launch(tensors, out=None, swizzle=STAGE1_SWIZZLE):
        if out is not None and fits is not None and not fits(out):
            return out.copy_(launch(tensors, None, swizzle))
        out = output(ki, tensors, out)
        run(args(tensors, out, swizzle))
        return out

    setattr(launch, "bound", lambda tensors, swizzle=STAGE1_SWIZZLE: bound_launcher(ki, run, args, launch, tensors,
                                                                                   swizzle, before, buffers))
    return launch


def bound_launcher(ki: KernelInputs, run: KernelLaunch, args: Callable[..., tuple], launch: Callable[..., torch.Tensor],
                   tensors: Sequence[torch.Tensor], swizzle: int,
                   before: Callable[[], None] | None = None,
                   buffers: Callable[[torch.device], tuple] | None = None) -> Callable[..., torch.Tensor] | None:
    """`launch` bound to one problem and swizzle: `fn(*tensors, out=None)` for operands with the shapes,
    strides, dtypes and device of `tensors` (a dispatch key's problem) allocates the output (or takes a
    row-major `out`) and launches the binary with the first call's arguments, changing only the
    pointers: no argument building per call.  A call the binding cannot serve (another alignment, device, a profiler's
    launch hook) goes through `launch`.  `buffers(device)`: the scratch tensors `args` adds (fetched
    again per call: they may differ per stream).  None where there is no direct path (the
    interpreter, an unbindable argument list).

    Example:
        >>> bound_launcher(None, KernelLaunch(None, (1,), {}), lambda t, out, s: (), None, [], 1) is None
        True
    """
    if run.fast is None:
        return None
    first = output(ki, tensors, None)
    device = first.device
    scratch = (lambda: ()) if buffers is None else (lambda: buffers(device))
    bind = run.fast.bind(args(tensors, first, swizzle), (*tensors, *scratch()), first)
    if bind is None:
        return None
    size, dtype, empty = ki.out_size, ki.result_dtype, torch.empty

    def bound(*operands: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:  # else a row-major output of the problem's size (Inductor's buffer)
            out = empty(size, dtype=dtype, device=device)
        if before is not None:
            before()
        if bind(operands if buffers is None else (*operands, *scratch()), out):
            return out
        return launch(operands, out, swizzle)

    return bound


def traced_launcher(ki: KernelInputs, run: KernelLaunch, args: Callable[..., tuple]) -> Callable[..., torch.Tensor]:
    """The launcher `Template.trace` returns for a one-kernel template: `launch(tensors, out=None,
    **runtime)` allocates the output with torch and launches `run`'s kernel through
    `torch.library.wrap_triton`, so a `torch.compile` trace records the kernel call itself (outside a
    trace it launches through Triton's JIT).

    Example:
        >>> callable(traced_launcher(None, KernelLaunch(None, (1,), {}), lambda tensors, out: ()))
        True
    """

    def launch(tensors, out=None, **runtime):
        from torch.library import wrap_triton

        out = output(ki, tensors, out)
        wrap_triton(run.kernel)[run.grid](*args(tensors, out, **runtime), **run.meta)
        return out

    return launch


@functools.lru_cache(maxsize=None)
def _space_of(config_space: Callable[[str], list[dict[str, int]]], size: str) -> tuple[dict[str, int], ...]:
    """`config_space(size)`, once per process: a template is built per tune, its space is not."""
    return tuple(config_space(size))


class TritonTemplate(Template):
    """Base of the Triton templates.

    A subclass sets `uid` and `kernel_file` (its `src_hash` follows from that file and
    `common_kernel.py`), `config_space` (size -> compile-time configs) and implements
    `compile_configs` and `compile`.  `supports` asks, in order: `available()` (Triton, or the
    Triton feature the kernel needs), the op (`ops`), the dtype (`dtypes`), `runs_on(ki)` (a CUDA
    device, or the CPU under the interpreter), 32-bit in-matrix offsets, and `offered(ki)`, the
    template's own rule for which problems it is worth offering on.

    Example:
        >>> from gemmtune.templates.triton.mm import TritonMMTemplate
        >>> TritonMMTemplate.src_hash == kernel_hash("mm_kernel.py"), TritonMMTemplate().family
        (True, 'triton')
    """

    family = "triton"
    any_out_stride = True  # masked pointer stores (the TMA templates where TMA cannot store a row; `out_fits`)
    native_devices = ("cuda",)
    runtime_space: Mapping[str, Sequence[Any]] = {"swizzle": SWIZZLES}
    default_runtime: Mapping[str, Any] = {"swizzle": STAGE1_SWIZZLE}
    ops: tuple[str, ...] = ("mm", "addmm", "bmm")
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    kernel_file: ClassVar[str]
    config_space: ClassVar[Callable[[str], list[dict[str, int]]]]

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "kernel_file" in cls.__dict__:
            cls.src_hash = kernel_hash(cls.kernel_file)

    def __init__(self, space: Sequence[Mapping[str, int]] | None = None, size: str = "default"):
        """`space` replaces the compile-time space; otherwise `config_space(size)` ("default" or "max")."""
        self.space = list(space) if space is not None else [dict(c) for c in _space_of(type(self).config_space, size)]

    def available(self) -> bool:
        """Whether this Python has what the kernel needs."""
        return triton_available()

    def runs_on(self, ki: KernelInputs) -> bool:
        """Whether the kernel can run on `ki`'s device: CUDA, or the CPU through the interpreter."""
        return ki.device_type == "cuda" or (ki.device_type == "cpu" and interpreting())

    def offered(self, ki: KernelInputs) -> bool:
        """The template's own rule for the problems it is offered on (default: all it supports)."""
        return True

    def launch_spec(self, choice: Choice, ki: KernelInputs) -> tuple[KernelLaunch, Callable[..., tuple]]:
        """One-kernel templates: the kernel launch of `choice` and `args(tensors, out, **runtime)`, its
        runtime arguments.  `compile` warms it up; `trace` emits it (set `traceable = True`)."""
        raise NotImplementedError(f"{self.uid}: no single-kernel launch spec")

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        run, args = self.launch_spec(choice, ki)
        return swizzled_launcher(ki, example, run, args, fits=self.out_fits(ki))

    def out_fits(self, ki: KernelInputs) -> Callable[[torch.Tensor], bool] | None:
        """Whether a binary for `ki` writes a given output as it is (None: any output; default)."""
        return None

    def trace(self, choice: Choice, ki: KernelInputs) -> Launcher:
        return traced_launcher(ki, *self.launch_spec(choice, ki))

    def supports(self, ki: KernelInputs) -> bool:
        # 32-bit in-matrix offsets: each matrix must stay under 2**31 elements.
        return (self.available() and ki.op in self.ops and ki.dtype in self.dtypes and self.runs_on(ki)
                and max(ki.M * ki.K, ki.K * ki.N, ki.M * ki.N) < 2**31 and self.offered(ki))
