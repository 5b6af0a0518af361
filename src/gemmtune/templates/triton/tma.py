"""The `triton_tma_persistent` template: persistent GEMM over device-side TMA descriptors.

For Hopper-class GPUs (compute capability >= 9) and fp16/bf16 (fp32 with `allow_fp32=True`):
`mm` and `addmm` with a row-major A and a row-major B or a transposed contiguous weight
(`B = W.t()`).  TMA needs 16-byte-aligned row strides (`K * elt` and `N * elt` multiples of 16,
checked by `tma_compatible`) and 16-byte-aligned base pointers (checked at compile and launch).

Compile-time config: BLOCK_M/N/K, num_stages, num_warps, EPILOGUE_SUBTILE (0/1).  Runtime:
`swizzle` (GROUP_M), M, N, K, strides.  The grid is `min(SMs, tiles)` programs.

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
import hashlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import Launcher, Template, split_operands
from .mm import (SPACE_SIZES, STAGE1_SWIZZLE, SWIZZLES, _input_precision, _pow2_at_least, _smem_limit,
                        interpreting, triton_available, triton_cdiv)

KERNEL_FILE = Path(__file__).with_name("tma_kernel.py")
_ACC_REGS_MAX = 128
_INTERPRETER_SMS = 4


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
    if size not in SPACE_SIZES:
        raise ValueError(f"config_space: unknown size {size!r}; expected one of {', '.join(SPACE_SIZES)}")
    full = size == "max"
    space = []
    for bm in (64, 128, 256):
        for bn in ((32, 64, 128, 256) if full else (64, 128, 256)):
            for bk in ((32, 64, 128) if full else (64, 128)):
                for stages in ((2, 3, 4, 5, 6) if full else (3, 4, 5)):
                    for warps in (4, 8):
                        for subtile in ((0, 1) if bn >= 64 else (0,)):
                            tile = bm * bn
                            if tile // (32 * warps) > _ACC_REGS_MAX or warps == 8 and bm < 128:
                                continue  # accumulator spills; 2 warpgroups want 128+ rows
                            if not full and (warps == 4 and tile > 128 * 128 or warps == 8 and tile < 128 * 128
                                             or subtile and bn < 128 or not subtile and bn == 128 or bk == 128 and tile > 128 * 128
                                             or bm == 256 and bn < 128):
                                continue
                            smem = stages * (bm + bn) * bk * 2 + bm * bn * 2 // (2 if subtile else 1)
                            if smem > 232_448:
                                continue
                            space.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages,
                                              num_warps=warps, EPILOGUE_SUBTILE=subtile))
    return space


_SMEM_RESERVE = 1024  # bytes the compiler keeps for barriers and scalars


def fit_configs(space: Sequence[Mapping[str, int]], M: int, N: int, K: int, elt_bytes: int,
                smem_limit: int, has_bias: bool = False) -> list[dict[str, int]]:
    """Clamp tiles to the problem (BLOCK_M >= 64 for wgmma, BLOCK_N and BLOCK_K >= 32); drop
    duplicates and configs whose pipeline plus epilogue buffer (plus, with a bias, the layout
    conversion scratch the compiler adds: BM*BN bytes, measured on an H200) exceed shared memory.

    Example:
        >>> cfg = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8, EPILOGUE_SUBTILE=1)
        >>> [c["BLOCK_M"] for c in fit_configs([cfg], 16, 4096, 4096, 2, 232448)]
        [64]
    """
    seen, out = set(), []
    caps = (max(64, _pow2_at_least(M)), max(32, _pow2_at_least(N)), max(32, _pow2_at_least(K)))
    for cfg in space:
        c = dict(cfg)
        for key, cap in zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), caps):
            c[key] = min(c[key], cap)
        if c["BLOCK_N"] < 64:
            c["EPILOGUE_SUBTILE"] = 0
        if c["num_warps"] == 8 and c["BLOCK_M"] < 128:
            c["num_warps"] = 4
        bm, bn, bk = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
        epilogue = bm * bn * elt_bytes // (2 if c["EPILOGUE_SUBTILE"] else 1) + (bm * bn if has_bias else 0)
        if c["num_stages"] * (bm + bn) * bk * elt_bytes + epilogue + _SMEM_RESERVE > smem_limit:
            continue
        if bm * bn // (32 * c["num_warps"]) > _ACC_REGS_MAX:
            continue
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def tma_compatible(ki: KernelInputs) -> bool:
    """Whether TMA descriptors can describe the operands: unit inner strides, 16-byte-aligned row
    strides (`K * elt`, `N * elt` multiples of 16), a row-major A and a row- or column-major B.

    Example:
        >>> import torch
        >>> ki = lambda a, b: KernelInputs.from_tensors("mm", a, b)
        >>> tma_compatible(ki(torch.ones(5, 64, dtype=torch.float16), torch.ones(24, 64, dtype=torch.float16).t()))
        True
        >>> tma_compatible(ki(torch.ones(5, 60, dtype=torch.float16), torch.ones(60, 24, dtype=torch.float16)))
        False
    """
    elt = torch.empty((), dtype=ki.dtype).element_size()
    if (ki.K * elt) % 16 or (ki.N * elt) % 16:
        return False
    return _row_stride(ki.a.stride, ki.a.size, "row", elt) is not None and b_trans(ki) is not None


def b_trans(ki: KernelInputs) -> bool | None:
    """False: B row-major `[K, N]`; True: B is `W.t()` of a row-major `[N, K]` W; None: neither."""
    elt = torch.empty((), dtype=ki.dtype).element_size()
    if _row_stride(ki.b.stride, ki.b.size, "row", elt) is not None:
        return False
    if _row_stride(ki.b.stride, ki.b.size, "col", elt) is not None:
        return True
    return None


def _row_stride(stride: Sequence[int], size: Sequence[int], order: str, elt: int) -> int | None:
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
def _num_sms(device: str) -> int:
    return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count


def _capability(device: str) -> tuple[int, int]:
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


def _check_aligned(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.data_ptr() % 16:
            raise ValueError(f"triton_tma_persistent: operand at {t.data_ptr():#x} is not 16-byte aligned (TMA)")


class TritonTMAPersistentTemplate(Template):
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
    family = "triton"
    src_hash = hashlib.sha256(KERNEL_FILE.read_bytes()).hexdigest()
    runtime_space = {"swizzle": SWIZZLES}
    default_runtime = {"swizzle": STAGE1_SWIZZLE}
    native_devices = ("cuda",)

    def __init__(self, space: Sequence[Mapping[str, int]] | None = None, size: str = "default",
                 num_sms: int | None = None, allow_fp32: bool = False):
        self.space = list(space) if space is not None else config_space(size)
        self.num_sms = num_sms
        self.dtypes = (torch.float16, torch.bfloat16) + ((torch.float32,) if allow_fp32 else ())

    def supports(self, ki: KernelInputs) -> bool:
        if not tensor_descriptors_available() or ki.op not in ("mm", "addmm") or ki.dtype not in self.dtypes:
            return False
        if ki.device_type == "cuda":
            if _capability(ki.device)[0] < 9:
                return False
        elif not (ki.device_type == "cpu" and interpreting()):
            return False
        return max(ki.M * ki.K, ki.K * ki.N, ki.M * ki.N) < 2**31 and tma_compatible(ki)

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        elt = torch.empty((), dtype=ki.dtype).element_size()
        return fit_configs(self.space, ki.M, ki.N, ki.K, elt, _smem_limit(ki.device),
                           has_bias=ki.op == "addmm" and ki.beta != 0.0)

    def sms(self, ki: KernelInputs) -> int:
        """Programs of a full persistent grid: the device's SMs (constexpr NUM_SMS: one binary per device)."""
        return self.num_sms or (_INTERPRETER_SMS if ki.device_type == "cpu" else _num_sms(ki.device))

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        from .tma_kernel import tma_persistent_kernel

        cfg = choice.config_dict
        bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        M, N, K, alpha, beta = ki.M, ki.N, ki.K, ki.alpha, ki.beta
        trans = b_trans(ki)
        if trans is None or not tma_compatible(ki):
            raise ValueError(f"triton_tma_persistent: {ki.describe()} has strides TMA cannot describe")
        elt = torch.empty((), dtype=ki.dtype).element_size()
        stride_am = _row_stride(ki.a.stride, ki.a.size, "row", elt)
        stride_b = _row_stride(ki.b.stride, ki.b.size, "col" if trans else "row", elt)
        sms = self.sms(ki)
        grid = (max(1, min(sms, triton_cdiv(M, bm) * triton_cdiv(N, bn))), 1, 1)
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, B_TRANS=trans, EPILOGUE_SUBTILE=bool(cfg["EPILOGUE_SUBTILE"]),
                    NUM_SMS=sms, num_stages=cfg["num_stages"], num_warps=cfg["num_warps"],
                    HAS_BIAS=ki.op == "addmm" and beta != 0.0, SCALED=ki.op == "addmm" and alpha != 1.0,
                    INPUT_PRECISION=_input_precision(ki.dtype))
        interp = interpreting()

        def args(tensors, out, swizzle):
            bias, a, b = split_operands(ki, tensors)
            if not out.is_contiguous():
                raise ValueError(f"triton_tma_persistent: output must be row-major [M, N], got strides {out.stride()}")
            _check_aligned(a, b, out)
            if bias is not None:
                sbias = bias.expand(M, N).stride()
            else:
                bias, sbias = out, (0, 0)
            return (a, b, out, bias, M, N, K, stride_am, stride_b, N, *sbias, alpha, beta, swizzle)

        def launch(tensors, out=None, swizzle=STAGE1_SWIZZLE):
            if out is None:
                out = torch.empty(ki.out_size, dtype=ki.dtype, device=tensors[-1].device)
            if not interp:
                ensure_allocator()
            tma_persistent_kernel[grid](*args(tensors, out, swizzle), **meta)
            return out

        if not interp:
            out = torch.empty(ki.out_size, dtype=ki.dtype, device=example[-1].device)
            with torch.cuda.device(example[-1].device):
                ensure_allocator()
                compiled = tma_persistent_kernel.warmup(*args(example, out, STAGE1_SWIZZLE), grid=grid, **meta)
                init = getattr(compiled, "_init_handles", None)  # shared-memory overflows surface here
                if init is not None:
                    init()
        return launch
