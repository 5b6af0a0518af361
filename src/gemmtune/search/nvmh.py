"""Optional stage-0 cost model from NVIDIA's nvMatmulHeuristics (`pip install gemmtune[heuristics]`).

nvMatmulHeuristics (nvMH) is a CPU-only analytic GEMM model shipped as a small shared library.
For a problem (M, N, K, batch, layout, precision) and a GPU from its predefined list it

- ranks its own configurations (`NvmhModel.recommend`: CTA tile, stages, swizzle, split-K, with an
  estimated runtime), and
- estimates the runtime of any configuration we describe (`NvmhModel.estimate`).

This module maps our Triton template configs (BLOCK_M/N/K, num_stages, num_warps, SPLIT_K, the
runtime swizzle) onto nvMH's kernel configuration (the warp tile comes from splitting the CTA tile
over `num_warps`), so nvMH can serve as `ModelPrunedOptions.model` for `model_pruned`'s stage 0.
Where the package is missing or the GPU is not one nvMH knows, `stage0_model` falls back to the
built-in analytic model (`gemmtune.search.cost_model.estimate_ms`).

Findings (package 0.1.0.27, H200_SXM, CPU only): the TRITON target models Ampere-style mma
(instruction 16x8x16) and estimates ~0.97-0.99 ms for bf16 M=4096, N=14336, K=4096 (cuBLAS measures
0.60-0.72 ms); the CUTLASS3 target (TMA + wgmma) estimates 0.52 ms for the same problem.  Its
estimate ignores BLOCK_K and stages once the tile fits, and returns 0 for configurations it
cannot describe (e.g. a 64x128 warp tile); those map to `inf` here.  `NvMatmulHeuristicsInterfaceEx.
estimateRuntime` and `estimateSiliconMetric` of that wrapper fail (missing base method; segfault),
so this module calls the library's `nvMatmulHeuristicsEstimateRuntime` directly.

Example:
    >>> from gemmtune.search.nvmh import gpu_for
    >>> gpu_for("NVIDIA H200"), gpu_for("NVIDIA H100 80GB HBM3"), gpu_for("Intel Xeon")
    ('H200_SXM', 'H100_SXM', None)
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import math
import threading
from typing import Any, Mapping, Sequence

import torch

from ..core.choices import Choice
from .base import CostModel, ProblemDims

SWIZZLES = (1, 2, 4, 8)
MODEL_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
# Device-name fragments -> nvMH predefined GPU, most specific first.
_GPUS = (("H200", "H200_SXM"), ("H100 PCIE", "H100_PCIE"), ("H100 NVL", "H100_NVL"), ("H100", "H100_SXM"),
         ("H20", "H20_SXM"), ("GB300", "GB300_NVL"), ("GB200", "GB200_NVL"), ("B200", "B200"),
         ("A100-PCIE", "A100_PCIE_80GB"), ("A100 PCIE", "A100_PCIE_80GB"), ("A100", "A100_SXM_80GB"),
         ("A30", "A30_PCIE"), ("A40", "A40_PCIE"), ("A10", "A10_PCIE"), ("L40S", "L40S"), ("L40", "L40"),
         ("L20", "L20"), ("L4", "L4"), ("RTX PRO 6000", "RTX_PRO_6000"), ("RTX 6000 ADA", "RTX_6000_ADA"),
         ("RTX A6000", "RTX_A6000"), ("RTX 5090", "RTX_5090"), ("RTX 5080", "RTX_5080"),
         ("RTX 4090", "RTX_4090"), ("RTX 3090", "RTX_3090"))
_LOCK = threading.Lock()  # the library's handle is not documented as thread-safe


def available() -> bool:
    """Whether the `nvidia-matmul-heuristics` package is importable."""
    return importlib.util.find_spec("nvMatmulHeuristics") is not None


def gpu_for(device_name: str) -> str | None:
    """nvMH's predefined GPU for a `torch.cuda.get_device_name()` string (or an nvMH name), else None."""
    name = device_name.upper().replace("_", " ")
    if available():
        from nvMatmulHeuristics import NvMatmulHeuristicsNvidiaGpu as Gpu

        if device_name.upper() in Gpu.__members__ and device_name.upper() != "END":
            return device_name.upper()
    for fragment, gpu in _GPUS:
        if fragment in name:
            return gpu
    return None


def precision_for(dtype: torch.dtype | int) -> str:
    """nvMH precision string (inputs, compute, output) for a dtype or an element size in bytes.

    Example:
        >>> precision_for(torch.bfloat16), precision_for(2), precision_for(torch.float32) in ("SSS", "SFS")
        ('TST', 'HSH', True)
    """
    if dtype in (torch.bfloat16,):
        return "TST"
    if dtype in (torch.float16, 2):
        return "HSH"
    if dtype in (torch.float32, 4):
        return "SFS" if torch.backends.cuda.matmul.allow_tf32 else "SSS"
    return "DDD"


def warp_splits(config: Mapping[str, int]) -> list[tuple[int, int]]:
    """Warp tiles (M, N) that split the CTA tile over `num_warps` warps, squarest first.

    Example:
        >>> warp_splits(dict(BLOCK_M=128, BLOCK_N=256, num_warps=8))[0]
        (64, 64)
    """
    bm, bn, warps = config["BLOCK_M"], config["BLOCK_N"], config.get("num_warps", 4)
    out = []
    wm_count = 1
    while wm_count <= warps:
        wn_count = warps // wm_count
        if wm_count * wn_count == warps and bm % wm_count == 0 and bn % wn_count == 0:
            out.append((bm // wm_count, bn // wn_count))
        wm_count *= 2
    return sorted(out, key=lambda t: (abs(math.log2(t[0] / t[1])), -t[0]))


class NvmhModel:
    """nvMH as a cost model: `model(config, M, N, K, dtype_bytes=2, batch=1) -> estimated ms`.

    `gpu` is an nvMH predefined GPU name (`gpu_for`), `precision` an nvMH precision string (None:
    from `dtype_bytes` at each call), `b_layout` "row" or "col" (B = W.t()), `target` the nvMH
    backend ("TRITON"; "CUTLASS3" models TMA + wgmma kernels).  nvMH's estimate ignores stages and
    BLOCK_K once a tile fits, so many configs tie; with `tiebreak` (default) `__call__` adds 1e-4 x
    the analytic model's estimate, which orders ties without reordering distinct estimates.

    Example:
        >>> m = NvmhModel("H200_SXM")   # doctest: +SKIP
        >>> cfg = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=8)
        >>> 0.5 < m(cfg, 4096, 14336, 4096) < 2.0   # doctest: +SKIP
        True
    """

    def __init__(self, gpu: str, precision: str | None = None, b_layout: str = "row", target: str = "TRITON",
                 tiebreak: bool = True):
        from nvMatmulHeuristics import (NvMatmulHeuristicsFlags, NvMatmulHeuristicsInterfaceEx,
                                        NvMatmulHeuristicsMatmulLayout, NvMatmulHeuristicsNvidiaGpu,
                                        NvMatmulHeuristicsTarget)

        self.gpu, self.precision, self.b_layout, self.target_name = gpu, precision, b_layout, target
        self.target = NvMatmulHeuristicsTarget[target]
        self.layout = (NvMatmulHeuristicsMatmulLayout.NT_ROW_MAJOR if b_layout == "col"
                       else NvMatmulHeuristicsMatmulLayout.NN_ROW_MAJOR)
        self.h = NvMatmulHeuristicsInterfaceEx(backend=self.target,
                                               flags=NvMatmulHeuristicsFlags.PERF_MODEL_BASED_AUTO_TUNING,
                                               gpu=NvMatmulHeuristicsNvidiaGpu[gpu])
        self.tiebreak = tiebreak
        self._loaded: set[str] = set()
        self._estimate = functools.lru_cache(maxsize=65536)(self._estimate_uncached)

    # -- the library ----------------------------------------------------------------------------
    def _prec(self, dtype_bytes: int) -> str:
        return self.precision or precision_for(dtype_bytes)

    def _ensure_loaded(self, prec: str) -> None:
        if prec not in self._loaded:
            self.h.loadInternalDiscoverySet(self.layout, prec)
            self._loaded.add(prec)

    def _estimate_uncached(self, cfg: tuple, M: int, N: int, K: int, batch: int, swizzle: int, prec: str) -> float:
        c = dict(cfg)
        best = math.inf
        with _LOCK:
            self._ensure_loaded(prec)
            problem = self.h.makeNvMatmulHeuristicsProblem(M, N, K, self.layout, batch)
            for wm, wn in warp_splits(c):
                k = self.h.nvmmhKernelConfiguration()
                k.cta[0], k.cta[1], k.cta[2] = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
                k.warp[0], k.warp[1], k.warp[2] = wm, wn, c["BLOCK_K"]
                k.instr[0], k.instr[1], k.instr[2] = 16, 8, 16
                k.splitK = int(c.get("SPLIT_K", 1))
                k.loadStages = int(c.get("num_stages", 3))
                k.gridSwizzle = swizzle
                k.ctaOrder = 0
                k.cluster[0], k.cluster[1] = 1, 1
                seconds = self.h.nvMatmulHeuristicsEstimateRuntime(
                    self.h.handle, prec.encode("ascii"), ctypes.c_int(int(self.target)), ctypes.byref(problem),
                    ctypes.byref(k), self.h.hardware_descriptor)
                if seconds > 0:  # 0: nvMH cannot describe this warp split
                    best = min(best, seconds * 1e3)
        return best

    # -- our interface --------------------------------------------------------------------------
    def estimate(self, config: Mapping[str, Any], M: int, N: int, K: int, dtype_bytes: int = 2, batch: int = 1,
                 swizzle: int | None = None) -> float:
        """Estimated ms of one config at one swizzle (None: the best of 1, 2, 4, 8); inf if nvMH cannot say."""
        if not all(k in config for k in MODEL_KEYS):
            return math.inf
        cfg = tuple(sorted((k, int(v)) for k, v in config.items()))
        prec = self._prec(dtype_bytes)
        swizzles = SWIZZLES if swizzle is None else (int(swizzle),)
        return min(self._estimate(cfg, M, N, K, batch, s, prec) for s in swizzles)

    def __call__(self, config: Mapping[str, Any], M: int, N: int, K: int, dtype_bytes: int = 2,
                 batch: int = 1) -> float:
        ms = self.estimate(config, M, N, K, dtype_bytes, batch)
        if self.tiebreak and math.isfinite(ms):
            from .cost_model import estimate_ms, hardware_for

            analytic = estimate_ms(config, M, N, K, dtype_bytes, batch, hardware_for(self.gpu.replace("_", " ")))
            ms += 1e-4 * analytic if math.isfinite(analytic) else 1e-3 * ms
        return ms

    def recommend(self, M: int, N: int, K: int, dtype_bytes: int = 2, batch: int = 1,
                  count: int = 16) -> list[dict[str, Any]]:
        """nvMH's own configs for the problem, in its order, mapped to our keys plus `est_ms`."""
        prec = self._prec(dtype_bytes)
        with _LOCK:
            problem = self.h.makeNvMatmulHeuristicsProblem(M, N, K, self.layout, batch)
            found = self.h.get(problem, count, precision=prec)
        out = []
        for r in found:
            k = r["kernel"]
            warps = (k.cta_tile_m // max(1, k.warp_tile_m)) * (k.cta_tile_n // max(1, k.warp_tile_n))
            out.append(dict(BLOCK_M=k.cta_tile_m, BLOCK_N=k.cta_tile_n, BLOCK_K=k.cta_tile_k,
                            num_stages=k.stages, num_warps=warps, SPLIT_K=k.split_k, swizzle=k.swizzle_factor,
                            cta_order=k.cta_order, est_ms=r["runtime"] * 1e3))
        return out


@functools.lru_cache(maxsize=32)
def _cached_model(gpu: str, precision: str | None, b_layout: str, target: str) -> NvmhModel:
    return NvmhModel(gpu, precision, b_layout, target)


def nvmh_model(device_name: str, dtype: torch.dtype | int | None = None, b_layout: str = "row",
               target: str = "TRITON") -> NvmhModel | None:
    """An `NvmhModel` for a device name, or None when the package is missing or the GPU unknown."""
    gpu = gpu_for(device_name)
    if gpu is None or not available():
        return None
    try:
        return _cached_model(gpu, None if dtype is None else precision_for(dtype), b_layout, target)
    except (OSError, KeyError, AssertionError, AttributeError):  # library failed to load, or unknown enum
        return None


def stage0_model(device_name: str, dtype: torch.dtype | int | None = None, b_layout: str = "row",
                 prefer: str = "nvmh") -> CostModel:
    """The cost model for `ModelPrunedOptions.model`: nvMH where it covers the GPU (`prefer="nvmh"`),
    else the analytic model for the device (`prefer="analytic"` always gives it).

    Replayed on the recorded H200 suite (plain template only), the analytic
    model kept the exhaustive winner more often: with library kernels in the pool, N=10 binaries,
    0.00% mean / 0.00% max regret against nvMH's 0.09% / 2.13%; templates alone, 0.19% / 1.95%
    against 6.2% / 58% (nvMH misranks M=128 and N=28672 shapes).  The analytic model was calibrated
    on that data and knows nothing of split-K or TMA kernels, which nvMH models (split-K) or can
    (CUTLASS3 target): measure before choosing the default.

    Example:
        >>> from gemmtune.search.cost_model import estimate_ms
        >>> stage0_model("cpu") is estimate_ms, stage0_model("NVIDIA H200", prefer="analytic") is estimate_ms
        (True, True)
    """
    if prefer not in ("nvmh", "analytic"):
        raise ValueError(f"stage0_model: prefer must be 'nvmh' or 'analytic', got {prefer!r}")
    model = nvmh_model(device_name, dtype, b_layout) if prefer == "nvmh" else None
    if model is not None:
        return model
    from .cost_model import H200, estimate_ms, hardware_for

    hw = hardware_for(device_name)
    return estimate_ms if hw is H200 else functools.partial(estimate_ms, hw=hw)


def rank_with_nvmh(choices: Sequence[Choice], dims: ProblemDims, device_name: str,
                   dtype: torch.dtype | None = None, b_layout: str = "row") -> list[Choice] | None:
    """Every choice, nvMH's estimate (at the choice's own swizzle) fastest first; choices it cannot
    describe (library kernels, configs without BLOCK_M/N/K) follow in their order.  None when the
    package or the GPU is not covered, or nvMH can estimate none of the choices.

    Example:
        >>> from gemmtune.search.base import ProblemDims
        >>> rank_with_nvmh([Choice("aten_mm", None)], ProblemDims(64, 64, 64), "cpu") is None
        True
    """
    model = nvmh_model(device_name, dtype if dtype is not None else dims.dtype_bytes, b_layout)
    if model is None:
        return None
    scored, rest = [], []
    for i, c in enumerate(choices):
        cfg = c.config_dict
        if c.is_extern or not all(k in cfg for k in MODEL_KEYS):
            rest.append(c)
            continue
        swizzle = c.runtime_dict.get("swizzle")
        ms = model.estimate(cfg, dims.M, dims.N, dims.K, dims.dtype_bytes, dims.batch, swizzle)
        scored.append((ms, i, c))
    if not any(math.isfinite(ms) for ms, _, _ in scored):
        return None
    scored.sort(key=lambda t: (t[0], t[1]))
    return [c for _, _, c in scored] + rest
