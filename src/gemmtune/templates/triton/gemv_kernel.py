"""Triton kernel of the `triton_gemv` template (hashed into the template's `src_hash`).

One program computes BLOCK_N outputs of one row of A (and one batch): it streams a
BLOCK_N x BLOCK_K tile of B per step, multiplies it by the matching BLOCK_K slice of that row,
accumulates in fp32 element-wise and reduces over K once at the end.  No tensor cores: with
M <= 4 the product is bound by reading B once, which this does with every load coalesced along
whichever of B's dimensions is contiguous.
"""

import triton
import triton.language as tl


@triton.jit
def gemv_kernel(A, B, C, BIAS, M, N, K,
                stride_ab, stride_am, stride_ak,
                stride_bb, stride_bk, stride_bn,
                stride_cb, stride_cm, stride_cn,
                stride_biasm, stride_biasn, alpha, beta,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                HAS_BIAS: tl.constexpr, SCALED: tl.constexpr):
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    bid = tl.program_id(2).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    a_row = A + bid * stride_ab + m * stride_am
    b_cols = B + bid * stride_bb + rn[:, None] * stride_bn
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        a = tl.load(a_row + kk * stride_ak, mask=k_ok, other=0.0).to(tl.float32)
        b = tl.load(b_cols + kk[None, :] * stride_bk, mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += b * a[None, :]
    out = tl.sum(acc, axis=1)
    if SCALED:
        out = tl.where(alpha == 0.0, 0.0, out * alpha)  # alpha == 0 drops the product, as torch.addmm does
    if HAS_BIAS:
        bias = tl.load(BIAS + m * stride_biasm + rn * stride_biasn, mask=n_ok, other=0.0).to(tl.float32)
        out = out + beta * bias
    tl.store(C + bid * stride_cb + m * stride_cm + rn * stride_cn, out.to(C.dtype.element_ty), mask=n_ok)
