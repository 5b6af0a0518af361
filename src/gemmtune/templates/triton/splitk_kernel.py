"""The Triton kernels behind the `triton_splitk` template: deterministic two-pass split-K.

Pass 1 (`splitk_partial_kernel`): program (tile, s, z) multiplies the s-th of SPLIT_K slices of
the K dimension for one output tile and writes the fp32 partial product to a workspace
`[batch, SPLIT_K, M, N]`.  Pass 2 (`splitk_reduce_kernel`) sums the SPLIT_K partials of each
element in a fixed order (so results are bitwise reproducible), applies alpha, beta * bias and
casts to the output dtype.

M, N, K, strides, alpha/beta and the tile swizzle GROUP_M are runtime arguments; GROUP_M is
excluded from Triton's integer specialisation so every swizzle shares one binary.
This file is hashed whole as the template's `src_hash`.
"""

import triton
import triton.language as tl


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
    # Swizzled tile order (as in triton_kernel.py): GROUP_M rows of tiles walked column by column.
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_z = tl.program_id(2).to(tl.int64)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % width) % group_size)
    pid_n = (pid % width) // group_size

    # This program's slice of K: whole BLOCK_K steps, the last slice may be short or empty.
    k_steps = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_steps, SPLIT_K)
    k_first = pid_s * per_split
    k_last = tl.minimum(k_first + per_split, k_steps)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    ram = rm % M  # wrapped rows/columns keep loads in bounds; the store is masked
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
    if SCALED:
        acc = acc * alpha
    if HAS_BIAS:
        bias = tl.load(BIAS + rm[:, None] * stride_biasm + rn[None, :] * stride_biasn, mask=mask, other=0.0)
        acc = acc + beta * bias.to(tl.float32)
    c_ptrs = C + pid_z * stride_cz + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)
