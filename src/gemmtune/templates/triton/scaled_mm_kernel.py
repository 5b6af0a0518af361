"""The Triton fp8 GEMM kernel behind the `triton_scaled_mm` template (`torch._scaled_mm`'s op).

fp8 A [M, K] (row-major) times fp8 B [K, N] (column-major, as torch requires), accumulated in
float32; the epilogue multiplies by the scales (ROWWISE: `scale_a` [M, 1] per row and `scale_b`
[1, N] per column; else one scalar each), adds the bias (N elements, `stride_bias` apart: a 1-D
bias may be a strided view) and stores in C's dtype.
FAST_ACCUM (the problem's `use_fast_accum`) lets `tl.dot` accumulate into the running sum, where
the tensor cores may keep fewer bits; without it each K step's product is added in float32, and
within a K step the tensor cores' partial sums are promoted to float32 at least every
MAX_IMPRECISE (`max_num_imprecise_acc`: at most 128) elements of K.  Triton's default on sm_90 is
never: a BLOCK_K of 256 then read 1.6e-4 relative error on an H200 where cuBLASLt's exact mode and
BLOCK_K 128 stay under 1e-4.
M, N, K, the strides and the tile swizzle GROUP_M are runtime arguments, as in `mm_kernel.py`.
This file and `common_kernel.py` are hashed into the template's `src_hash`.
"""

import triton
import triton.language as tl

from .common_kernel import swizzled_tile


@triton.jit
def fp8_dot(A, B, ram, rbn, K, stride_am, stride_ak, stride_bk, stride_bn,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            EVEN_K: tl.constexpr, FAST_ACCUM: tl.constexpr, MAX_IMPRECISE: tl.constexpr):
    """The float32 product of rows `ram` of A and columns `rbn` of B (both inside the matrices)."""
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = A + ram[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = B + rk[:, None] * stride_bk + rbn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        if FAST_ACCUM:
            acc = tl.dot(a, b, acc, out_dtype=tl.float32)
        else:
            acc += tl.dot(a, b, out_dtype=tl.float32, max_num_imprecise_acc=MAX_IMPRECISE)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit(do_not_specialize=["GROUP_M"])
def scaled_mm_kernel(
    A, B, C, SCALE_A, SCALE_B, BIAS,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_bias,
    GROUP_M,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ROWWISE: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, FAST_ACCUM: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m, pid_n = swizzled_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Edge rows/columns wrap around (in-bounds loads without M/N masks); the store is masked.
    ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    acc = fp8_dot(A, B, ram, rbn, K, stride_am, stride_ak, stride_bk, stride_bn,
                  BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, FAST_ACCUM, MAX_IMPRECISE)
    # The epilogue reads the scales and the bias at the true rows and columns, masked: the wrapped
    # `ram` / `rbn` carry contiguity hints that are false in an edge tile, and a vector load of
    # `SCALE_A + ram` there faulted (misaligned address, an odd M, BLOCK_M 256, on an H200).
    # scaled_tma_kernel.py's `_scaled` is the same epilogue: change both.
    if ROWWISE:
        scale_a = tl.load(SCALE_A + rm, mask=rm < M, other=0.0)
        scale_b = tl.load(SCALE_B + rn, mask=rn < N, other=0.0)
        acc = acc * scale_a[:, None] * scale_b[None, :]
    else:
        acc = acc * (tl.load(SCALE_A) * tl.load(SCALE_B))
    if HAS_BIAS:
        acc = acc + tl.load(BIAS + rn * stride_bias, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(C + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(C.dtype.element_ty), mask=mask)
