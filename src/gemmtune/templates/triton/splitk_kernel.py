"""The Triton kernels behind the `triton_splitk` template: deterministic two-pass split-K.

Pass 1 (`splitk_partial_kernel`): program (tile, s, z) multiplies the s-th of SPLIT_K slices of
the K dimension for one output tile and writes the fp32 partial product to a workspace
`[batch, SPLIT_K, M, N]`.  Pass 2 (`splitk_reduce_kernel`) sums the SPLIT_K partials of each
element in a fixed order (so results are bitwise reproducible), applies alpha, beta * bias and
casts to the output dtype.

M, N, K, strides, alpha/beta and the tile swizzle GROUP_M are runtime arguments; GROUP_M is
excluded from Triton's integer specialisation so every swizzle shares one binary.
This file and `common_kernel.py` are hashed into the template's `src_hash`.
"""

import triton
import triton.language as tl

from .common_kernel import dot_k_range, k_slice, store_tile, swizzled_tile


@triton.jit(do_not_specialize=["GROUP_M"])
def splitk_partial_kernel(
    A, B, WS,
    M, N, K,
    stride_az, stride_am, stride_ak,
    stride_bz, stride_bk, stride_bn,
    stride_wz, stride_ws, stride_wm,
    GROUP_M,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_z = tl.program_id(2).to(tl.int64)
    pid_m, pid_n = swizzled_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    k_first, k_last = k_slice(K, pid_s, BLOCK_K, SPLIT_K)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Wrapped rows/columns keep loads in bounds; the store is masked.
    acc = dot_k_range(A, B, pid_z, rm % M, rn % N, k_first, k_last, K, stride_az, stride_am, stride_ak,
                      stride_bz, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, False, INPUT_PRECISION)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    w_ptrs = WS + pid_z * stride_wz + pid_s * stride_ws + rm[:, None] * stride_wm + rn[None, :]
    tl.store(w_ptrs, acc, mask=mask)


@triton.jit
def splitk_reduce_kernel(
    WS, C, BIAS,
    M, N,
    stride_wz, stride_ws, stride_wm,
    stride_cz, stride_cm, stride_cn,
    stride_biasm, stride_biasn,
    alpha, beta,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_z = tl.program_id(1).to(tl.int64)
    grid_n = tl.cdiv(N, BLOCK_N)
    rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    w_ptrs = WS + pid_z * stride_wz + rm[:, None] * stride_wm + rn[None, :]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(0, SPLIT_K):  # fixed order: deterministic
        acc += tl.load(w_ptrs + s * stride_ws, mask=mask, other=0.0)
    store_tile(acc, C, BIAS, rm, rn, pid_z, M, N, stride_cz, stride_cm, stride_cn, stride_biasm, stride_biasn,
               alpha, beta, HAS_BIAS, SCALED)
