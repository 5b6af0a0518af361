"""Triton kernel of the `triton_skinny` template (hashed with `common_kernel.py` into its `src_hash`).

Grid: (output tiles, SPLIT_K, batch).  Program (t, s, z) multiplies the s-th slice of K for tile t
with tensor cores.  With SPLIT_K == 1 it writes the tile.  Otherwise it writes its fp32 partial tile
to a tile-major workspace `[tiles, SPLIT_K, BLOCK_M, BLOCK_N]`, then bumps the tile's arrival
counter (acq_rel, GPU scope); the program that arrives last sums the SPLIT_K partials in slice
order (so the result does not depend on arrival order), applies the epilogue, writes the tile and
resets the counter to 0 for the next launch.  One launch, no atomics on data, deterministic.
"""

import triton
import triton.language as tl

from .common_kernel import dot_k_range, k_slice, store_tile, swizzled_tile


@triton.jit(do_not_specialize=["GROUP_M"])
def skinny_kernel(
    A, B, C, BIAS,
    M, N, K,
    stride_az, stride_am, stride_ak,
    stride_bz, stride_bk, stride_bn,
    stride_cz, stride_cm, stride_cn,
    stride_biasm, stride_biasn,
    alpha, beta,
    WS, COUNTERS,
    GROUP_M,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_z = tl.program_id(2).to(tl.int64)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = swizzled_tile(pid, grid_m, grid_n, GROUP_M)
    k_first, k_last = k_slice(K, pid_k, BLOCK_K, SPLIT_K)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows/columns past the edge wrap around: loads stay in bounds without a mask on M/N;
    # the store is masked, so wrapped values are never written.
    acc = dot_k_range(A, B, pid_z, rm % M, rn % N, k_first, k_last, K, stride_az, stride_am, stride_ak,
                      stride_bz, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, False, INPUT_PRECISION)
    if SPLIT_K == 1:
        store_tile(acc, C, BIAS, rm, rn, pid_z, M, N, stride_cz, stride_cm, stride_cn, stride_biasm, stride_biasn,
                   alpha, beta, HAS_BIAS, SCALED)
    else:
        tile = pid_z * grid_m * grid_n + pid_m * grid_n + pid_n
        offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tile_ws = WS + tile * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(tile_ws + pid_k * (BLOCK_M * BLOCK_N) + offs, acc)
        tl.debug_barrier()  # every thread's partial is written before the counter moves
        arrived = tl.atomic_add(COUNTERS + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            tl.debug_barrier()
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                total += tl.load(tile_ws + s * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
            tl.atomic_xchg(COUNTERS + tile, 0, sem="relaxed", scope="gpu")
            store_tile(total, C, BIAS, rm, rn, pid_z, M, N, stride_cz, stride_cm, stride_cn, stride_biasm,
                       stride_biasn, alpha, beta, HAS_BIAS, SCALED)
