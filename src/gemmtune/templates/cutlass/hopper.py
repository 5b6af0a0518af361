"""The `cutlass_hopper` template: a CuTe DSL (nvidia-cutlass-dsl 4.x) Hopper GEMM (docs/CUTLASS.md).

The kernel (`hopper_kernel.py`) is a warp-specialised persistent GEMM for sm_90: one producer
warpgroup issues TMA loads into a `stages`-deep shared-memory ring, one or two consumer warpgroups
run WGMMA on it, clusters of 1x1, 2x1 or 1x2 CTAs multicast A or B.  Compile-time config: tile M/N/K,
stages, cluster shape.  Runtime arguments: `swizzle` (tiles grouped along the raster direction, as
triton's GROUP_M) and `raster` ("m" or "n"), so one binary serves all eight orders.

Status: validated on an H200 (tests/gpu/test_cutlass_gpu.py: odd sizes, both B layouts, bias, bmm,
every swizzle and raster order against float64; docs/CUTLASS.md has the measurements).  It is an
opt-in family: `backends=("extern", "cutlass")` (or any tuple naming "cutlass") puts it in the pool;
the device's default pool leaves it out, because its DSL compiles are serialised (about 0.6-1.2 s
each: the DSL's tracing is not thread-safe) and its kernels do not yet beat cuBLAS.  Binaries are
reused within a process across shapes (dynamic layouts), not across processes.  Known gaps: the
epilogue stores element by element from registers (no TMA store); each launch builds its DLPack
views on the host.

Example:
    >>> from gemmtune.templates.cutlass.hopper import config_space, smem_bytes
    >>> all(smem_bytes(**c) <= 232_448 for c in config_space())
    True
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import itertools
import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ...core.choices import Choice
from ...core.inputs import KernelInputs
from ..base import Launcher, Template, pow2_at_least, source_hash, split_operands, unique_configs

log = logging.getLogger("gemmtune.templates.cutlass")

KERNEL_FILE = Path(__file__).with_name("hopper_kernel.py")
ORDER_FILE = Path(__file__).with_name("order.py")
DSL_DISTRIBUTION = "nvidia-cutlass-dsl"
KERNEL_VALIDATED = True
"""True: tests/gpu/test_cutlass_gpu.py passed on a Hopper GPU with this kernel (bench/gpu_run.py cutlass-test).
Set it False while a kernel change awaits that run: the template then stays out of every pool."""
NOT_VALIDATED = "kernel not validated on a GPU yet"

DEFAULT_SMEM = 232_448  # Hopper's opt-in shared memory per block
SMEM_RESERVE = 1024  # scalars, alignment padding and the scheduler's bookkeeping
CLUSTERS = ((1, 1), (2, 1), (1, 2))
SWIZZLES = (1, 2, 4, 8)
RASTERS = ("m", "n")
STAGE1_SWIZZLE = 8  # stage 1 of the prescreen times every config at this order: chosen on this template's
STAGE1_RASTER = "n"  # H200 sweep (data/sweep_h200_bf16_cutlass.jsonl.gz), the order with the least regret
# at small X (X=1: 0.75%, X=2: 0.09%, X=3: 0; docs/CUTLASS.md)
DTYPES = (torch.float16, torch.bfloat16)
OPS = ("mm", "addmm", "bmm")


def installed_version(distribution: str) -> str | None:
    """The installed version of a Python distribution, or None when it is not installed.

    Example:
        >>> installed_version("no-such-distribution-here") is None
        True
    """
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def dsl_version() -> str | None:
    """The installed nvidia-cutlass-dsl version, or None when it is not installed.

    Example:
        >>> v = dsl_version(); v is None or v[0].isdigit()
        True
    """
    return installed_version(DSL_DISTRIBUTION)


def dsl_importable() -> bool:
    """Whether `import cutlass.cute` would find the DSL (nothing is imported here)."""
    try:
        return importlib.util.find_spec("cutlass") is not None and dsl_version() is not None
    except (ImportError, ValueError):
        return False


def kernel_src_hash(version: str | None = None) -> str:
    """`src_hash`: sha256 of hopper_kernel.py, order.py (the tile order it inlines) and the DSL version
    (a new DSL retires the timings).

    Example:
        >>> kernel_src_hash("4.8.1") != kernel_src_hash("4.9.0")
        True
    """
    return source_hash(KERNEL_FILE, ORDER_FILE, f"{DSL_DISTRIBUTION}=={version if version is not None else dsl_version()}")


def smem_bytes(BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, stages: int, elt_bytes: int = 2, **_: Any) -> int:
    """Shared memory of one CTA: the A and B stage ring, two 8-byte mbarriers per stage (full and
    empty), and `SMEM_RESERVE`.  The epilogue stores from registers, so it adds nothing.

    Example:
        >>> smem_bytes(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, stages=4)
        197696
    """
    return stages * ((BLOCK_M + BLOCK_N) * BLOCK_K * elt_bytes + 16) + SMEM_RESERVE


def fits(cfg: Mapping[str, Any], smem_limit: int = DEFAULT_SMEM, elt_bytes: int = 2) -> bool:
    """Whether `cfg` fits `smem_limit` bytes of shared memory and 128 fp32 accumulator registers per
    consumer thread (BLOCK_M 64: one consumer warpgroup; 128: two, 64 rows each).

    Example:
        >>> fits(dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, stages=6))
        False
    """
    acc_regs = 64 * cfg["BLOCK_N"] // 128  # each consumer warpgroup owns 64 rows
    return smem_bytes(elt_bytes=elt_bytes, **cfg) <= smem_limit and acc_regs <= 128


def config_space(smem_limit: int = DEFAULT_SMEM) -> list[dict[str, Any]]:
    """Every compile-time config that fits: tile M {64, 128} x N {64, 128, 256} x K 64, stages 2-6,
    cluster (1, 1), (2, 1), (1, 2).

    Example:
        >>> space = config_space()
        >>> len(space), sorted({c["stages"] for c in space}), sorted({(c["cluster_m"], c["cluster_n"]) for c in space})
        (81, [2, 3, 4, 5, 6], [(1, 1), (1, 2), (2, 1)])
    """
    space = []
    for bm, bn, stages, (cm, cn) in itertools.product((64, 128), (64, 128, 256), range(2, 7), CLUSTERS):
        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, stages=stages, cluster_m=cm, cluster_n=cn)
        if fits(cfg, smem_limit):
            space.append(cfg)
    return space


def fit_configs(space: Sequence[Mapping[str, Any]], M: int, N: int) -> list[dict[str, Any]]:
    """`space` with tiles clamped to the problem (M to at least 64 for WGMMA, N to at least 64) and
    clusters larger than the tile grid dropped to 1.

    Example:
        >>> fit_configs([dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, stages=3, cluster_m=2, cluster_n=1)], 16, 96)
        [{'BLOCK_M': 64, 'BLOCK_N': 128, 'BLOCK_K': 64, 'stages': 3, 'cluster_m': 1, 'cluster_n': 1}]
    """
    fitted = []
    for cfg in space:
        c = dict(cfg, BLOCK_M=min(cfg["BLOCK_M"], max(64, pow2_at_least(M))),
                 BLOCK_N=min(cfg["BLOCK_N"], max(64, pow2_at_least(N))))
        if -(-M // c["BLOCK_M"]) < c["cluster_m"] * 2 or -(-N // c["BLOCK_N"]) < c["cluster_n"] * 2:
            c.update(cluster_m=1, cluster_n=1)  # a cluster needs at least two of its shape of tiles
        fitted.append(c)
    return unique_configs(fitted)


def tma_layout(ki: KernelInputs) -> str | None:
    """B's layout for TMA: "k" (B = W.t() of a row-major [N, K] W, nn.Linear), "n" (row-major [K, N]),
    None when TMA cannot describe the operands (inner stride 1, 16-byte-aligned rows, row-major A).

    Example:
        >>> a, w = torch.ones(5, 64, dtype=torch.float16), torch.ones(24, 64, dtype=torch.float16)
        >>> tma_layout(KernelInputs.from_tensors("mm", a, w.t())), tma_layout(KernelInputs.from_tensors("mm", a[:, :60], w[:, :60].t()))
        ('k', None)
    """
    elt = ki.dtype.itemsize
    if (ki.K * elt) % 16 or (ki.N * elt) % 16 or ki.a.stride[-1] != 1 or (ki.a.stride[-2] * elt) % 16:
        return None
    bs = ki.b.stride
    if bs[-1] == 1 and (bs[-2] * elt) % 16 == 0:
        return "n"
    if bs[-2] == 1 and (bs[-1] * elt) % 16 == 0:
        return "k"
    return None


def _hopper_gpu() -> str | None:
    """None when a CUDA device of compute capability >= 9.0 is present, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    return None if major >= 9 else f"compute capability {major}.{minor} < 9.0"


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why the template is skipped here (None: usable).  Logged once, at INFO, the first time.

    Example:
        >>> unavailable_reason() is None or isinstance(unavailable_reason(), str)
        True
    """
    if not dsl_importable():
        reason: str | None = f"{DSL_DISTRIBUTION} is not installed (pip install 'gemmtune[cutlass]')"
    else:
        reason = _hopper_gpu()
        if reason is None and not KERNEL_VALIDATED:
            reason = NOT_VALIDATED
    if reason is not None:
        log.info("cutlass_hopper template skipped: %s", reason)
    return reason


def ensure_cache_dir() -> None:
    """Point the DSL's cache directory at gemmtune's cache (unless CUTE_DSL_CACHE_DIR is set).  It holds
    the DSL's own IR caches; compiled kernels are kept by `disk` instead (the DSL does not reuse them
    from its cache across processes, 4.8.1)."""
    from ...core.settings import cache_dir

    os.environ.setdefault("CUTE_DSL_CACHE_DIR", str(cache_dir() / "cutedsl"))


class CutlassHopperTemplate(Template):
    """CuTe DSL Hopper mm/addmm/bmm for fp16/bf16 with TMA, WGMMA and a persistent tile scheduler.

    Example:
        >>> t = CutlassHopperTemplate()
        >>> t.uid, t.family, sorted(t.runtime_space), t.available() == (unavailable_reason() is None)
        ('cutlass_hopper', 'cutlass', ['raster', 'swizzle'], True)
    """

    uid = "cutlass_hopper"
    family = "cutlass"
    src_hash = kernel_src_hash()
    native_devices: tuple[str, ...] = ()  # opt-in: only a `backends` naming "cutlass" pools it (module doc)
    runtime_space: Mapping[str, Sequence[Any]] = {"swizzle": SWIZZLES, "raster": RASTERS}
    default_runtime: Mapping[str, Any] = {"swizzle": STAGE1_SWIZZLE, "raster": STAGE1_RASTER}

    def __init__(self, space: Sequence[Mapping[str, Any]] | None = None, size: str = "default",
                 require_validation: bool = True):
        """`space` replaces the compile-time space (`config_space()`); `size` is accepted for the
        registry's uniform call and does not change it (the space is small already).
        `require_validation=False` (the GPU tests) offers the kernel before `KERNEL_VALIDATED`."""
        self.space = list(space) if space is not None else config_space()
        self.require_validation = require_validation

    def available(self) -> bool:
        """The DSL installed, a Hopper GPU present and the kernel validated (`unavailable_reason`)."""
        reason = unavailable_reason()
        return reason is None or (reason == NOT_VALIDATED and not self.require_validation)

    def unavailable(self) -> str | None:
        return None if self.available() else unavailable_reason()

    def supports(self, ki: KernelInputs) -> bool:
        return (ki.device_type == "cuda" and ki.op in OPS and ki.dtype in DTYPES and self.available()
                and tma_layout(ki) is not None
                and (ki.op != "addmm" or (ki.beta in (0.0, 1.0) and ki.alpha != 0.0)))  # alpha 0: no product

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        from ..triton.base import smem_limit

        limit = smem_limit(ki.device)
        return fit_configs([c for c in self.space if fits(c, limit)], ki.M, ki.N)

    def prepare_compiles(self, choices: Sequence[Choice], ki: KernelInputs, example: Sequence[torch.Tensor]) -> None:
        """Hand the binaries not yet built here or on disk to compile processes (`parallel`), when there
        are enough of them to pay for the processes' start; `compile` then waits for each and loads it."""
        ensure_cache_dir()
        from . import disk, hopper_kernel, parallel

        b_major = tma_layout(ki)
        if b_major is None or self.src_hash is None or not disk.enabled():
            return
        has_bias = ki.op == "addmm" and ki.beta != 0.0
        jobs = [job for c in choices
                if (job := hopper_kernel.job_for(c.config_dict, ki.dtype, b_major, has_bias, example, ki,
                                                 self.src_hash)) is not None]
        device = example[-2].device
        if jobs:
            parallel.start(jobs, env=hopper_kernel.compile_env(jobs[0]["arch"]),
                           cuda_index=(device.index or 0) if device.type == "cuda" else None)

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        """Compile the binary of `choice` for `ki`'s layouts, or load the one an earlier process kept on
        disk (`disk`)."""
        ensure_cache_dir()
        from . import disk, hopper_kernel

        b_major = tma_layout(ki)
        if b_major is None:
            raise ValueError(f"cutlass_hopper: {ki.describe()} has strides TMA cannot describe")
        has_bias = ki.op == "addmm" and ki.beta != 0.0
        disk.bind_context(example[-1].device)  # a compile thread has no CUDA context of its own
        run = hopper_kernel.build(choice.config_dict, ki.dtype, b_major, has_bias, example, ki, src_hash=self.src_hash)

        def launch(tensors, out=None, swizzle=STAGE1_SWIZZLE, raster=STAGE1_RASTER):
            bias, a, b = split_operands(ki, tensors)
            if out is None:
                out = torch.empty(ki.out_size, dtype=ki.dtype, device=a.device)
            run(a, b, out, bias if has_bias else None, int(swizzle), RASTERS.index(raster), ki.alpha)
            return out

        return launch
