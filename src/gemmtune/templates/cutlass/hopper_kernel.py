"""The CuTe DSL source of `cutlass_hopper`.  Checked on an H200 by tests/gpu/test_cutlass_gpu.py
(odd sizes, both B layouts, bias, bmm, every swizzle and raster order, against float64).

D[l] = alpha * A[l] @ B[l] (+ bias) in fp16/bf16 with fp32 accumulation.  A is (M, K, L) K-major;
B is (N, K, L), K-major (nn.Linear weight) or N-major (row-major [K, N] B); D is (M, N, L) N-major.

Warp specialisation: warpgroups 0..W-1 (W = BLOCK_M // 64) run WGMMA, each on 64 rows of the tile;
warpgroup W is the producer, one warp of which issues the TMA loads into a `stages`-deep ring
(`PipelineTmaAsync`, full/empty mbarriers).  In a 2x1 (1x2) cluster the CTAs of one cluster column
(row) share the B (A) tile: each loads a slice and multicasts it.  Persistent: a grid of at most
`max_clusters` clusters walks the cluster tiles; `tile_order` maps a linear index to a cluster tile
under the RUNTIME `swizzle` and `raster` (one binary serves every order).  The epilogue writes the
accumulator from registers, predicated at the M and N edges (TMA fills out-of-bounds loads with 0).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import from_dlpack
from cutlass.tensor_utils import LayoutEnum

from . import disk, parallel
from .tracing import DSL_COMPILE_LOCK
from .order import tile_order

WG_THREADS = 128
log = logging.getLogger("gemmtune")
_COMPILE_LOCK = DSL_COMPILE_LOCK  # shared with cutlass_operators (tracing.py)
"""The DSL's tracing is not thread-safe (4.8.1, checked on CPU: two compiles in two threads fail
with "An MLIR function requires a Location"; one at a time in a worker thread works), and gemmtune
compiles in a thread pool: DSL compiles are serialised here.  Parallel compiles would need processes."""
_COMPILED: dict[tuple, Any] = {}  # this process's binaries (see `build`), under _COMPILE_LOCK


class HopperGemm:
    """One compile-time configuration of the kernel; `__call__` is the `@cute.jit` host function."""

    def __init__(self, cfg: Mapping[str, Any], has_bias: bool, fixed_order: tuple[int, int] | None = None):
        """`fixed_order=(swizzle, raster)` bakes the tile order in as compile-time constants (the
        runtime arguments are then ignored): only for measuring what the runtime order costs."""
        self.fixed_order = fixed_order
        self.tile = (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"])
        self.stages = cfg["stages"]
        self.cluster = (cfg["cluster_m"], cfg["cluster_n"], 1)
        self.has_bias = has_bias
        self.mma_wgs = self.tile[0] // 64
        self.threads = (self.mma_wgs + 1) * WG_THREADS
        self.producer_warp = self.mma_wgs * 4

    def _tma(self, tensor: cute.Tensor, smem_staged: Any, tiler: tuple, multicast: int):
        op = cpasync.CopyBulkTensorTileG2SMulticastOp() if multicast > 1 else cpasync.CopyBulkTensorTileG2SOp()
        one_stage = cute.slice_(smem_staged, (None, None, 0))
        return cpasync.make_tiled_tma_atom(op, tensor, one_stage, tiler, num_multicast=multicast)

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, mBias: cute.Tensor,
                 alpha: Float32, swizzle: Int32, raster: Int32, max_clusters: Int32):
        dtype = mA.element_type
        a_layout, b_layout = LayoutEnum.from_tensor(mA), LayoutEnum.from_tensor(mB)
        tiled_mma = sm90.make_trivial_tiled_mma(dtype, dtype, a_layout.sm90_mma_major_mode(),
                                                b_layout.sm90_mma_major_mode(), Float32,
                                                (self.mma_wgs, 1, 1), tiler_mn=(64, self.tile[1]))
        sA_layout = sm90.make_smem_layout_a(a_layout, self.tile, dtype, self.stages)
        sB_layout = sm90.make_smem_layout_b(b_layout, self.tile, dtype, self.stages)
        tma_a, gA = self._tma(mA, sA_layout, (self.tile[0], self.tile[2]), self.cluster[1])
        tma_b, gB = self._tma(mB, sB_layout, (self.tile[1], self.tile[2]), self.cluster[0])

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sB_layout)], 1024]

        self.storage: Any = Storage
        clusters_m = cute.ceil_div(cute.ceil_div(mA.shape[0], self.tile[0]), self.cluster[0])
        clusters_n = cute.ceil_div(cute.ceil_div(mB.shape[0], self.tile[1]), self.cluster[1])
        self.kernel(tma_a, gA, tma_b, gB, mD, mBias, tiled_mma, sA_layout, sB_layout, alpha, swizzle, raster,
                    clusters_m, clusters_n, mA.shape[2]).launch(
            grid=(self.cluster[0], self.cluster[1], max_clusters), block=(self.threads, 1, 1),
            cluster=self.cluster, smem=self.storage.size_in_bytes())

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, gA: cute.Tensor, tma_b: cute.CopyAtom, gB: cute.Tensor,
               mD: cute.Tensor, mBias: cute.Tensor, tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout,
               sB_layout: cute.ComposedLayout, alpha: Float32, swizzle: Int32, raster: Int32,
               clusters_m: Int32, clusters_n: Int32, batches: Int32):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp == self.producer_warp:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        storage = cutlass.utils.SmemAllocator().allocate(self.storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        cluster_layout = cute.make_layout(self.cluster)
        stage_bytes = (cute.size_in_bytes(sA.element_type, cute.slice_(sA_layout, (None, None, 0)))
                       + cute.size_in_bytes(sB.element_type, cute.slice_(sB_layout, (None, None, 0))))
        ring = pipeline.PipelineTmaAsync.create(
            num_stages=self.stages, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.mma_wgs * WG_THREADS),
            tx_count=stage_bytes, barrier_storage=storage.bars.data_ptr(),
            cta_layout_vmnk=cute.make_layout((1, *self.cluster)), enable_multicast_signaling=True)
        if cute.size(cluster_layout) > 1:
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        coord = cluster_layout.get_flat_coord(rank)
        k_tiles = cute.ceil_div(gA.shape[1], self.tile[2])
        work = clusters_m * clusters_n * batches
        if warp >= self.producer_warp:
            cute.arch.warpgroup_reg_dealloc(40)
            if warp == self.producer_warp:
                self.produce(tma_a, gA, tma_b, gB, sA, sB, ring, cluster_layout, coord, swizzle, raster,
                             clusters_m, clusters_n, work, k_tiles)
        else:
            cute.arch.warpgroup_reg_alloc(232)
            self.consume(tiled_mma, sA, sB, ring, mD, mBias, alpha, tidx, coord, swizzle, raster,
                         clusters_m, clusters_n, work, k_tiles)

    @cute.jit
    def tile_of(self, idx: Int32, coord: Any, swizzle: Int32, raster: Int32, clusters_m: Int32, clusters_n: Int32):
        per_batch = clusters_m * clusters_n
        batch = idx // per_batch
        if cutlass.const_expr(self.fixed_order is not None):
            fixed: Any = self.fixed_order
            swizzle, raster = fixed
        cm, cn = tile_order(idx % per_batch, clusters_m, clusters_n, swizzle, raster, cutlass.min)
        return cm * self.cluster[0] + coord[0], cn * self.cluster[1] + coord[1], batch

    @cute.jit
    def produce(self, tma_a, gA, tma_b, gB, sA, sB, ring, cluster_layout, coord, swizzle, raster,
                clusters_m, clusters_n, work, k_tiles):
        a_mask = cute.make_layout_image_mask(cluster_layout, coord, mode=1) if self.cluster[1] > 1 else 0
        b_mask = cute.make_layout_image_mask(cluster_layout, coord, mode=0) if self.cluster[0] > 1 else 0
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        idx = cute.arch.block_idx()[2]
        while idx < work:
            tm, tn, l = self.tile_of(idx, coord, swizzle, raster, clusters_m, clusters_n)
            gA_k = cute.local_tile(gA[None, None, l], (self.tile[0], self.tile[2]), (tm, None))
            gB_k = cute.local_tile(gB[None, None, l], (self.tile[1], self.tile[2]), (tn, None))
            tAsA, tAgA = cpasync.tma_partition(tma_a, coord[1], cute.make_layout(self.cluster[1]),
                                               cute.group_modes(sA, 0, 2), cute.group_modes(gA_k, 0, 2))
            tBsB, tBgB = cpasync.tma_partition(tma_b, coord[0], cute.make_layout(self.cluster[0]),
                                               cute.group_modes(sB, 0, 2), cute.group_modes(gB_k, 0, 2))
            for k in cutlass.range(k_tiles, unroll=1):
                ring.producer_acquire(state)
                bar = ring.producer_get_barrier(state)
                cute.copy(tma_a, tAgA[None, k], tAsA[None, state.index], tma_bar_ptr=bar, mcast_mask=a_mask)
                cute.copy(tma_b, tBgB[None, k], tBsB[None, state.index], tma_bar_ptr=bar, mcast_mask=b_mask)
                ring.producer_commit(state)
                state.advance()
            idx += cute.arch.grid_dim()[2]
        ring.producer_tail(state)

    @cute.jit
    def consume(self, tiled_mma, sA, sB, ring, mD, mBias, alpha, tidx, coord, swizzle, raster,
                clusters_m, clusters_n, work, k_tiles):
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(tiled_mma.partition_shape_C((self.tile[0], self.tile[1])), Float32)
        k_blocks = cute.size(tCrA, mode=[2])
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        idx = cute.arch.block_idx()[2]
        while idx < work:
            tm, tn, l = self.tile_of(idx, coord, swizzle, raster, clusters_m, clusters_n)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
            for k in cutlass.range(k_tiles, unroll=1):
                ring.consumer_wait(state)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(k_blocks):
                    cute.gemm(tiled_mma, acc, tCrA[None, None, kb, state.index], tCrB[None, None, kb, state.index],
                              acc)
                    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                ring.consumer_release(state)
                state.advance()
            self.epilogue(thr_mma, acc, mD, mBias, alpha, tm, tn, l)
            idx += cute.arch.grid_dim()[2]

    @cute.jit
    def epilogue(self, thr_mma, acc, mD, mBias, alpha, tm, tn, l):
        gD = cute.local_tile(mD[None, None, l], (self.tile[0], self.tile[1]), (tm, tn))
        cD = cute.local_tile(cute.make_identity_tensor((mD.shape[0], mD.shape[1])),
                             (self.tile[0], self.tile[1]), (tm, tn))
        tDgD = thr_mma.partition_C(gD)
        tDcD = thr_mma.partition_C(cD)
        for i in cutlass.range_constexpr(cute.size(acc)):
            m, n = tDcD[i]
            if m < mD.shape[0] and n < mD.shape[1]:
                v = acc[i] * alpha
                if cutlass.const_expr(self.has_bias):
                    v = v + mBias[m, n, l].to(Float32)
                tDgD[i] = v.to(mD.element_type)


def _as_mkl(t: torch.Tensor, transpose: bool) -> torch.Tensor:
    """A 2-D or 3-D (batch-first) operand as the kernel's (rows, K, L) view; `transpose` swaps the
    last two dims first (B is given as [K, N] and the kernel reads it as (N, K))."""
    t = t if t.dim() == 3 else t.unsqueeze(0)
    if transpose:
        t = t.transpose(1, 2)
    return t.permute(1, 2, 0)


def _cute_tensor(t: torch.Tensor) -> cute.Tensor:
    leading = 1 if t.stride(1) == 1 else 0
    return from_dlpack(t, assumed_align=16).mark_layout_dynamic(leading_dim=leading)


def _arch(device: torch.device) -> str:
    """The GPU architecture a kernel is compiled for: the device's, or CUTE_DSL_ARCH (a CPU-only compile)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}a"
    return os.environ.get("CUTE_DSL_ARCH", "unknown")


def _views(a, b, out, bias):
    bias_view = bias.expand(out.shape) if bias is not None else out
    return (_cute_tensor(_as_mkl(a, False)), _cute_tensor(_as_mkl(b, True)), _cute_tensor(_as_mkl(out, False)),
            from_dlpack(_as_mkl(bias_view, False)))


def _plan(cfg: Mapping[str, Any], dtype: torch.dtype, b_major: str, has_bias: bool, device: torch.device,
          out_shape: tuple, fixed_order: tuple[int, int] | None) -> tuple[tuple, tuple, int]:
    """(this process's key, the disk key, the cluster bound) of a binary.  A, B and D have dynamic
    layouts: one binary serves every shape of these layouts.  The bias view's layout is static
    (broadcast strides): with a bias the output shape is in the keys."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    max_clusters = sms // (cfg["cluster_m"] * cfg["cluster_n"])
    shape = tuple(out_shape) if has_bias else None
    common = (tuple(sorted(cfg.items())), dtype, b_major, has_bias, fixed_order)
    return (*common, device, max_clusters, shape), (*common, max_clusters, shape), max_clusters


def build(cfg: Mapping[str, Any], dtype: torch.dtype, b_major: str, has_bias: bool,
          example: Any, ki: Any, fixed_order: tuple[int, int] | None = None,
          src_hash: str | None = None) -> Callable[..., None]:
    """Compile the kernel for `cfg` against the example operands; return
    `run(a, b, out, bias, swizzle, raster_index, alpha)` (runtime swizzle and raster).  `b_major`
    ("k" or "n") is read from the operands' strides; it is taken for the caller's checks only.
    With the template's `src_hash`, a kernel another process compiled is loaded from disk, and one
    compiled here is kept there (`disk`); one a compile process has (`parallel`) is waited for."""
    gemm = HopperGemm(cfg, has_bias, fixed_order)
    a, b = example[-2], example[-1]
    out = torch.empty(ki.out_size, dtype=dtype, device=a.device)
    bias = example[0] if has_bias else None
    key, disk_key, max_clusters = _plan(cfg, dtype, b_major, has_bias, a.device, tuple(ki.out_size), fixed_order)
    with _COMPILE_LOCK:
        compiled = _COMPILED.get(key)
    if compiled is None and src_hash is not None:  # outside the lock: other binaries load meanwhile
        path = disk.kernel_path(disk_key, src_hash, _arch(a.device))
        why = parallel.wait(str(path))
        if why not in (None, "not pending"):
            log.info("gemmtune: cutlass_hopper: compile process: %s; compiling here", why)
    with _COMPILE_LOCK:
        compiled = _COMPILED.get(key)
        if compiled is None:
            views = _views(a, b, out, bias)
            compiled = _COMPILED[key] = disk.load_or_compile(
                disk_key, src_hash, _arch(a.device),
                lambda: cute.compile(gemm, *views, Float32(1.0), Int32(8), Int32(0), Int32(max_clusters)))

    def run(a, b, out, bias, swizzle, raster, alpha):
        for t in (a, b, out):  # TMA operands and the 16-byte-assumed output; the bias is read element-wise
            if t.data_ptr() % 16:
                raise ValueError(f"cutlass_hopper: operand at {t.data_ptr():#x} is not 16-byte aligned (TMA)")
        compiled(*_views(a, b, out, bias), Float32(alpha), Int32(swizzle), Int32(raster), Int32(max_clusters))

    return run


def job_for(cfg: Mapping[str, Any], dtype: torch.dtype, b_major: str, has_bias: bool, example: Any, ki: Any,
            src_hash: str) -> dict | None:
    """What a compile process needs to build this binary and keep it on disk (`parallel`); None when
    this process or the disk already has it."""
    a = example[-2]
    key, disk_key, max_clusters = _plan(cfg, dtype, b_major, has_bias, a.device, tuple(ki.out_size), None)
    path = disk.kernel_path(disk_key, src_hash, _arch(a.device))
    with _COMPILE_LOCK:
        if key in _COMPILED or path.is_file():
            return None
    return {"path": str(path), "cfg": dict(cfg), "dtype": str(dtype).removeprefix("torch."), "has_bias": has_bias,
            "device": a.device.type, "arch": _arch(a.device), "max_clusters": max_clusters, "out": list(ki.out_size),
            "operands": [[list(t.shape), list(t.stride())] for t in example]}


def compile_env(arch: str) -> dict[str, str]:
    """What a compile process adds to its environment: the architecture to compile for."""
    return {"CUTE_DSL_ARCH": arch} if arch != "unknown" else {}


def compile_job(job: Mapping[str, Any]) -> None:
    """In a compile process: build `job`'s binary against operands of its shapes, strides and device
    type (contents unset) and keep it on disk; raises if it could not be kept."""
    device, dtype = torch.device(job["device"]), getattr(torch, job["dtype"])
    tensors = [torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride in job["operands"]]
    out = torch.empty(job["out"], dtype=dtype, device=device)
    bias = tensors[0] if job["has_bias"] else None
    compiled = cute.compile(HopperGemm(job["cfg"], job["has_bias"]), *_views(tensors[-2], tensors[-1], out, bias),
                            Float32(1.0), Int32(8), Int32(0), Int32(job["max_clusters"]))
    if not disk.save(compiled, Path(job["path"])):
        raise RuntimeError("compiled, but it could not be kept on disk")
