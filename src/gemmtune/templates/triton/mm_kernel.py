"""The Triton GEMM kernel behind the `triton_mm` template.

M, N, K, every stride, alpha/beta and the tile swizzle GROUP_M are runtime
arguments, so one compiled binary per (tile config, integer specialisation,
EVEN_K) serves every shape and every swizzle.  EVEN_K (K a multiple of
BLOCK_K) drops the K mask from the main loop.  GROUP_M is excluded from Triton's
integer specialisation so that swizzle=1 does not trigger a second compile.
This file is hashed whole as the template's `src_hash`.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["GROUP_M"])
def gemm_kernel(
    A, B, C, BIAS,
    M, N, K,
    stride_az, stride_am, stride_ak,
    stride_bz, stride_bk, stride_bn,
    stride_cz, stride_cm, stride_cn,
    stride_biasm, stride_biasn,
    alpha, beta,
    GROUP_M,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # Swizzled tile order: GROUP_M rows of tiles are walked column by column
    # so that consecutive programs share A and B tiles in L2.
    pid = tl.program_id(0)
    pid_z = tl.program_id(1).to(tl.int64)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % width) % group_size)
    pid_n = (pid % width) // group_size

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows/columns past the edge wrap around: loads stay in bounds without a
    # mask on M/N; the store below is masked, so wrapped values are never written.
    # The hints keep the wrapped indices contiguous for the compiler (vector loads).
    ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    a_ptrs = A + pid_z * stride_az + ram[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = B + pid_z * stride_bz + rk[:, None] * stride_bk + rbn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:  # K is a multiple of BLOCK_K (decided per problem): no K mask
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SCALED:
        acc = acc * alpha
    if HAS_BIAS:
        bias = tl.load(BIAS + rm[:, None] * stride_biasm + rn[None, :] * stride_biasn, mask=mask, other=0.0)
        acc = acc + beta * bias.to(tl.float32)
    c_ptrs = C + pid_z * stride_cz + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)
