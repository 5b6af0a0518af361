"""Triton kernel of the `triton_skinny` template (hashed into the template's `src_hash`).

Grid: (output tiles, SPLIT_K, batch).  Program (t, s, z) multiplies the s-th slice of K for tile t
with tensor cores.  With SPLIT_K == 1 it writes the tile.  Otherwise it writes its fp32 partial tile
to a tile-major workspace `[tiles, SPLIT_K, BLOCK_M, BLOCK_N]`, then bumps the tile's arrival
counter (acq_rel, GPU scope); the program that arrives last sums the SPLIT_K partials in slice
order (so the result does not depend on arrival order), applies the epilogue, writes the tile and
resets the counter to 0 for the next launch.  One launch, no atomics on data, deterministic.
"""

import triton
import triton.language as tl


@triton.jit
def _epilogue(acc, C, BIAS, rm, rn, pid_z, M, N, stride_cz, stride_cm, stride_cn, stride_biasm, stride_biasn,
              alpha, beta, HAS_BIAS: tl.constexpr, SCALED: tl.constexpr):
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SCALED:
        acc = acc * alpha
    if HAS_BIAS:
        bias = tl.load(BIAS + rm[:, None] * stride_biasm + rn[None, :] * stride_biasn, mask=mask, other=0.0)
        acc = acc + beta * bias.to(tl.float32)
    c_ptrs = C + pid_z * stride_cz + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["GROUP_M"])
def skinny_kernel(
    A, B, C, BIAS, WS, COUNTERS,
    M, N, K,
    stride_az, stride_am, stride_ak,
    stride_bz, stride_bk, stride_bn,
    stride_cz, stride_cm, stride_cn,
    stride_biasm, stride_biasn,
    alpha, beta,
    GROUP_M,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_z = tl.program_id(2).to(tl.int64)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % width) % group_size)
    pid_n = (pid % width) // group_size

    # This program's slice of K, in whole BLOCK_K steps (the last slice may be short or empty).
    k_steps = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(k_steps, SPLIT_K)
    k_first = pid_k * per
    k_last = tl.minimum(k_first + per, k_steps)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows/columns past the edge wrap around: loads stay in bounds without a mask on M/N;
    # the store is masked, so wrapped values are never written.
    ram = rm % M
    rbn = rn % N
    k0 = k_first * BLOCK_K
    a_ptrs = A + pid_z * stride_az + ram[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak
    b_ptrs = B + pid_z * stride_bz + (k0 + rk)[:, None] * stride_bk + rbn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if SPLIT_K == 1:
        _epilogue(acc, C, BIAS, rm, rn, pid_z, M, N, stride_cz, stride_cm, stride_cn, stride_biasm, stride_biasn,
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
            _epilogue(total, C, BIAS, rm, rn, pid_z, M, N, stride_cz, stride_cm, stride_cn, stride_biasm,
                      stride_biasn, alpha, beta, HAS_BIAS, SCALED)
