"""The `triton_tma_persistent` template: persistent GEMM over device-side TMA descriptors.

For Hopper-class GPUs (compute capability >= 9) and fp16/bf16 (fp32 with `allow_fp32=True`):
`mm` and `addmm` with a row-major A and a row-major B or a transposed contiguous weight
(`B = W.t()`).  TMA needs 16-byte-aligned row strides of A and B (checked by `tma_compatible`) and
16-byte-aligned operand bases (checked at compile and launch; an output off a 16-byte boundary is
computed into a new one and copied).  The output goes through a descriptor
too where its rows are 16-byte aligned (`tma_store`), else through masked pointer stores: a
vocabulary head with an odd N, or a padded twin that keeps N, loads through TMA all the same.

Compile-time config: BLOCK_M/N/K, num_stages, num_warps, EPILOGUE_SUBTILE (0/1).  Runtime:
`swizzle` (GROUP_M), M, N, K, strides.  The grid is `min(SMs, tiles)` programs.

It launches like the other templates, through `FastLaunch` where that serves the call: the kernel
takes plain pointers and builds its descriptors on the device, in a global scratch buffer that
Triton's launcher (JIT or direct) takes from the allocator `ensure_allocator` installs first.

On a machine without such a GPU it is offered only through Triton's interpreter
(`TRITON_INTERPRET=1`, family asked for by name), which runs tensor descriptors in numpy; a
template built with `num_sms=` small exercises the persistent loop there.

Example:
    >>> from gemmtune.templates.triton.tma import config_space
    >>> len(config_space()) < 100 <= len(config_space("max"))
    True
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable, Mapping, Sequence

import torch

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import Launcher, pow2_at_least, split_operands, streaming, unique_configs
from .base import (ACC_REGS_MAX, DEFAULT_SMEM, TILE_KEYS, KernelLaunch, TritonTemplate, acc_regs, bias_args, cdiv,
                   check_size, epilogue_flags, input_precision, interpreting, pipeline_smem, smem_limit,
                   swizzled_launcher, triton_available)

_INTERPRETER_SMS = 4
_SMEM_RESERVE = 1024  # bytes the compiler keeps for barriers and scalars


def tensor_descriptors_available() -> bool:
    """Whether this Triton has device-side tensor descriptors (`tl.make_tensor_descriptor`, 3.4+)."""
    if not triton_available():
        return False
    import triton.language as tl

    return hasattr(tl, "make_tensor_descriptor")


def config_space(size: str = "default") -> list[dict[str, int]]:
    """Compile-time configs before fitting: `"default"` (about 35) or `"max"` (about 300).

    Example:
        >>> sorted({c["BLOCK_M"] for c in config_space()})
        [64, 128, 256]
    """
    check_size(size)
    full = size == "max"
    space = []
    for bm, bn, bk, stages, warps in itertools.product((64, 128, 256), (32, 64, 128, 256) if full else (64, 128, 256),
                                                       (32, 64, 128) if full else (64, 128),
                                                       (2, 3, 4, 5, 6) if full else (3, 4, 5), (4, 8)):
        for subtile in ((0, 1) if bn >= 64 else (0,)):
            tile = bm * bn
            if acc_regs(bm, bn, warps) > ACC_REGS_MAX or warps == 8 and bm < 128:
                continue  # accumulator spills; 2 warpgroups want 128+ rows
            if not full and (warps == 4 and tile > 128 * 128 or warps == 8 and tile < 128 * 128
                             or subtile and bn < 128 or not subtile and bn == 128 or bk == 128 and tile > 128 * 128
                             or bm == 256 and bn < 128):
                continue
            if pipeline_smem(stages, bm, bn, bk) + bm * bn * 2 // (2 if subtile else 1) > DEFAULT_SMEM:
                continue
            space.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps,
                              EPILOGUE_SUBTILE=subtile))
    return space


def fit_configs(space: Sequence[Mapping[str, int]], M: int, N: int, K: int, elt_bytes: int, smem_limit: int,
                has_bias: bool = False, out_bytes: int | None = None, tma_out: bool = True) -> list[dict[str, int]]:
    """Clamp tiles to the problem (BLOCK_M >= 64 for wgmma, BLOCK_N and BLOCK_K >= 32); drop
    duplicates and configs whose pipeline plus epilogue buffer (plus, with a bias, the layout
    conversion scratch the compiler adds: BM*BN bytes, measured on an H200) exceed shared memory.
    `elt_bytes` is the operands' element size, `out_bytes` the output's (default: the same); a space
    without EPILOGUE_SUBTILE stages the whole output tile, and so does a store through pointers
    (`tma_out` False: the layout conversion before it takes a whole tile, measured on an H100).

    Example:
        >>> cfg = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8, EPILOGUE_SUBTILE=1)
        >>> [c["BLOCK_M"] for c in fit_configs([cfg], 16, 4096, 4096, 2, 232448)]
        [64]
    """
    cap_m, cap_n, cap_k = max(64, pow2_at_least(M)), max(32, pow2_at_least(N)), max(32, pow2_at_least(K))
    fitted = []
    for cfg in space:
        c = dict(cfg, BLOCK_M=min(cfg["BLOCK_M"], cap_m), BLOCK_N=min(cfg["BLOCK_N"], cap_n),
                 BLOCK_K=min(cfg["BLOCK_K"], cap_k))
        if "EPILOGUE_SUBTILE" in c and c["BLOCK_N"] < 64:
            c["EPILOGUE_SUBTILE"] = 0
        if c["num_warps"] == 8 and c["BLOCK_M"] < 128:
            c["num_warps"] = 4
        bm, bn, bk = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
        staged = bm * bn * (elt_bytes if out_bytes is None else out_bytes)
        epilogue = staged // (2 if c.get("EPILOGUE_SUBTILE") and tma_out else 1) + (bm * bn if has_bias else 0)
        if pipeline_smem(c["num_stages"], bm, bn, bk, elt_bytes) + epilogue + _SMEM_RESERVE > smem_limit:
            continue
        if acc_regs(bm, bn, c["num_warps"]) <= ACC_REGS_MAX:
            fitted.append(c)
    return unique_configs(fitted)


def tma_compatible(ki: KernelInputs) -> bool:
    """Whether TMA descriptors can describe the operands: unit inner strides, 16-byte-aligned row
    strides, a row-major A and a row- or column-major B.  The output's N may be odd (`tma_store`).

    Example:
        >>> import torch
        >>> ki = lambda a, b: KernelInputs.from_tensors("mm", a, b)
        >>> tma_compatible(ki(torch.ones(5, 64, dtype=torch.float16), torch.ones(21, 64, dtype=torch.float16).t()))
        True
        >>> tma_compatible(ki(torch.ones(5, 60, dtype=torch.float16), torch.ones(60, 24, dtype=torch.float16)))
        False
    """
    elt = torch.empty((), dtype=ki.dtype).element_size()
    return row_stride(ki.a.stride, ki.a.size, "row", elt) is not None and b_trans(ki) is not None


def tma_store(ki: KernelInputs) -> bool:
    """Whether the row-major output's rows are 16-byte aligned, so a descriptor stores it; else the
    kernel stores with masked pointer stores.

    Example:
        >>> import torch
        >>> a, odd, even = (torch.ones(n, 64, dtype=torch.float16) for n in (4, 21, 24))
        >>> tma_store(KernelInputs.from_tensors("mm", a, odd.t())), tma_store(KernelInputs.from_tensors("mm", a, even.t()))
        (False, True)
    """
    return (ki.N * ki.result_dtype.itemsize) % 16 == 0


def b_trans(ki: KernelInputs) -> bool | None:
    """False: B row-major `[K, N]`; True: B is `W.t()` of a row-major `[N, K]` W; None: neither."""
    elt = torch.empty((), dtype=ki.dtype).element_size()
    if row_stride(ki.b.stride, ki.b.size, "row", elt) is not None:
        return False
    if row_stride(ki.b.stride, ki.b.size, "col", elt) is not None:
        return True
    return None


def row_stride(stride: Sequence[int], size: Sequence[int], order: str, elt: int) -> int | None:
    """The descriptor's row stride of a 2-D operand read as row-major (`order="row"`) or as the
    transpose of a row-major matrix (`"col"`); None when TMA cannot describe it."""
    (rows, cols), (s_rows, s_cols) = size[-2:], stride[-2:]
    if order == "col":
        rows, cols, s_rows, s_cols = cols, rows, s_cols, s_rows
    if s_cols != 1 and cols > 1:
        return None
    row = s_rows if rows > 1 else cols  # a single row's stride is free: use the dense one
    return row if (row * elt) % 16 == 0 and row >= cols else None


@functools.lru_cache(maxsize=None)
def sm_count(device: str) -> int:
    """The SMs of CUDA `device` (a persistent grid's size)."""
    return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count


def capability(device: str) -> tuple[int, int]:
    """The compute capability of CUDA `device`."""
    return torch.cuda.get_device_capability(torch.device(device))


def _scratch(size: int, alignment: int, stream: Any) -> torch.Tensor:
    """Global scratch for device-side descriptors (one per program), from torch's caching allocator."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Install `_scratch` as Triton's allocator unless one is already set in this thread's context
    (Triton keeps it in a ContextVar: compile threads and the launching thread each need one)."""
    import triton

    try:
        from triton.runtime import _allocation

        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_scratch)


def check_aligned(uid: str, *tensors: torch.Tensor) -> None:
    """ValueError naming template `uid` unless every tensor's base is 16-byte aligned (TMA's rule)."""
    for t in tensors:
        if t.data_ptr() % 16:
            raise ValueError(f"{uid}: operand at {t.data_ptr():#x} is not 16-byte aligned (TMA)")


class TritonTMAPersistentTemplate(TritonTemplate):
    """Persistent TMA-descriptor Triton mm/addmm (Hopper+), fp16/bf16 (fp32 if `allow_fp32`).

    `num_sms` overrides the persistent grid size (default: the device's SM count; 4 under the
    interpreter).

    Example:
        >>> import torch
        >>> from gemmtune.core.inputs import KernelInputs
        >>> ki = KernelInputs.from_tensors("mm", torch.ones(4, 64, dtype=torch.float16), torch.ones(64, 8, dtype=torch.float16))
        >>> TritonTMAPersistentTemplate().supports(ki) == interpreting()
        True
    """

    uid = "triton_tma_persistent"
    any_out_stride = True  # an output row that TMA cannot store is stored through pointers (`tma_store`)
    kernel_file = "tma_kernel.py"
    config_space = staticmethod(config_space)
    ops = ("mm", "addmm")

    def __init__(self, space: Sequence[Mapping[str, int]] | None = None, size: str = "default",
                 num_sms: int | None = None, allow_fp32: bool = False):
        super().__init__(space, size)
        self.num_sms = num_sms
        self.dtypes = (torch.float16, torch.bfloat16) + ((torch.float32,) if allow_fp32 else ())

    def available(self) -> bool:
        return tensor_descriptors_available()

    def runs_on(self, ki: KernelInputs) -> bool:
        """Compute capability 9 or later (TMA, wgmma) on CUDA; the CPU through the interpreter."""
        if ki.device_type == "cuda":
            return capability(ki.device)[0] >= 9
        return super().runs_on(ki)

    def offered(self, ki: KernelInputs) -> bool:
        """Where TMA descriptors can describe the operands (`tma_compatible`)."""
        return tma_compatible(ki)

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        if streaming(ki.M, ki.N, ki.K):
            return []  # no K loop to overlap (`templates.base.streaming`)
        return fit_configs(self.space, ki.M, ki.N, ki.K, ki.dtype.itemsize, smem_limit(ki.device),
                           has_bias=epilogue_flags(ki)["HAS_BIAS"], tma_out=tma_store(ki))

    def sms(self, ki: KernelInputs) -> int:
        """Programs of a full persistent grid: the device's SMs (constexpr NUM_SMS: one binary per device)."""
        return self.num_sms or (_INTERPRETER_SMS if ki.device_type == "cpu" else sm_count(ki.device))

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        from .tma_kernel import tma_persistent_kernel

        cfg = choice.config_dict
        M, N, K = ki.M, ki.N, ki.K
        trans = b_trans(ki)
        if trans is None or not tma_compatible(ki):
            raise ValueError(f"triton_tma_persistent: {ki.describe()} has strides TMA cannot describe")
        stride_am = row_stride(ki.a.stride, ki.a.size, "row", ki.dtype.itemsize)
        stride_b = row_stride(ki.b.stride, ki.b.size, "col" if trans else "row", ki.dtype.itemsize)
        sms = self.sms(ki)
        grid = (max(1, min(sms, cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]))), 1, 1)
        run = KernelLaunch(tma_persistent_kernel, grid, dict(
            {k: cfg[k] for k in TILE_KEYS}, B_TRANS=trans, EPILOGUE_SUBTILE=bool(cfg["EPILOGUE_SUBTILE"]),
            NUM_SMS=sms, **epilogue_flags(ki), INPUT_PRECISION=input_precision(ki.dtype), TMA_STORE=tma_store(ki)))
        interp = interpreting()
        stored = run.meta["TMA_STORE"]

        def args(tensors, out, swizzle):
            bias, a, b = split_operands(ki, tensors)
            if not out.is_contiguous():
                raise ValueError(f"triton_tma_persistent: output must be row-major [M, N], got strides {out.stride()}")
            check_aligned("triton_tma_persistent", a, b, *([out] if stored else []))
            if not interp:
                ensure_allocator()  # the launch (JIT or direct) takes the descriptors' scratch from it
            bias, sbias = bias_args(bias, out, M, N)
            return (a, b, out, bias, M, N, K, stride_am, stride_b, N, *sbias, ki.alpha, ki.beta, swizzle)

        return swizzled_launcher(ki, example, run, args, before=None if interp else ensure_allocator,
                                 fits=self.out_fits(ki))

    def out_fits(self, ki: KernelInputs) -> Callable[[torch.Tensor], bool] | None:
        """A descriptor stores only an output on a 16-byte boundary (`tma_store`); another is computed into
        a new output and copied over (`swizzled_launcher`).  Pointer stores take any output."""
        return (lambda out: out.data_ptr() % 16 == 0) if tma_store(ki) else None
