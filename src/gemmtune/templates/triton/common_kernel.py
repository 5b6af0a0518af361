"""Triton device functions shared by the template kernels (`*_kernel.py` beside this file).

They are `@triton.jit` functions called from the kernels, which Triton inlines: a kernel built
from them compiles to the same code as one written out in full.  Every Triton template hashes
this file together with its own kernel file into its `src_hash` (`triton.base.kernel_hash`), so
a change here changes every dependent template's hash and retires its stored timings.
"""

import triton
import triton.language as tl


@triton.jit
def swizzled_tile(pid, grid_m, grid_n, GROUP_M):
    """(pid_m, pid_n) of the pid-th output tile in swizzled order: GROUP_M rows of tiles are walked
    column by column, so consecutive programs share A and B tiles in L2."""
    width = GROUP_M * grid_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % width) % group_size)
    pid_n = (pid % width) // group_size
    return pid_m, pid_n


@triton.jit
def k_slice(K, pid_s, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """[k_first, k_last) in whole BLOCK_K steps of the pid_s-th of SPLIT_K slices of K (the last
    slice may be short or empty)."""
    k_steps = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(k_steps, SPLIT_K)
    k_first = pid_s * per
    return k_first, tl.minimum(k_first + per, k_steps)


@triton.jit
def dot_k_range(A, B, pid_z, ram, rbn, k_first, k_last, K,
                stride_az, stride_am, stride_ak, stride_bz, stride_bk, stride_bn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """The fp32 product of rows `ram` of A and columns `rbn` of B over K steps [k_first, k_last).

    `ram` / `rbn` must lie inside the matrix (callers wrap edge rows and columns around and mask the
    store instead).  EVEN_K (K a multiple of BLOCK_K) drops the K mask from the loads.
    """
    rk = tl.arange(0, BLOCK_K)
    k0 = k_first * BLOCK_K
    a_ptrs = A + pid_z * stride_az + ram[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak
    b_ptrs = B + pid_z * stride_bz + (k0 + rk)[:, None] * stride_bk + rbn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_first, k_last):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def alpha_bias(acc, BIAS, rm, rn, M, N, stride_biasm, stride_biasn, alpha, beta,
               HAS_BIAS: tl.constexpr, SCALED: tl.constexpr):
    """`alpha * acc + beta * bias[rm, rn]` in fp32 (each term only where the op asks for it).

    alpha == 0 drops the product as torch.addmm does (NaN or Inf in A or B do not reach the output)."""
    if SCALED:
        acc = tl.where(alpha == 0.0, 0.0, acc * alpha)
    if HAS_BIAS:
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        bias = tl.load(BIAS + rm[:, None] * stride_biasm + rn[None, :] * stride_biasn, mask=mask, other=0.0)
        acc = acc + beta * bias.to(tl.float32)
    return acc


@triton.jit
def store_tile(acc, C, BIAS, rm, rn, pid_z, M, N, stride_cz, stride_cm, stride_cn, stride_biasm, stride_biasn,
               alpha, beta, HAS_BIAS: tl.constexpr, SCALED: tl.constexpr):
    """Apply the epilogue (`alpha_bias`) to the fp32 tile `acc` and store rows `rm`, columns `rn` of
    batch `pid_z` of C in C's dtype; rows and columns past the edge are not written."""
    acc = alpha_bias(acc, BIAS, rm, rn, M, N, stride_biasm, stride_biasn, alpha, beta, HAS_BIAS, SCALED)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    c_ptrs = C + pid_z * stride_cz + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)
