"""The Triton kernel behind the `triton_scaled_tma` template: a persistent fp8 GEMM over TMA descriptors.

fp8 A [M, K] (row-major) times B [K, N], where B is the column-major view torch's `_scaled_mm`
requires: the rows of a row-major [N, K] weight W (B = W.t()).  The grid holds at most one program
per SM; each program walks the output tiles `start, start + NUM_SMS, ...` in swizzled order (GROUP_M
rows of tiles walked column by column), as `tma_kernel.py` does.  A and W are read, and C written,
through device-side tensor descriptors (`tl.make_tensor_descriptor`, backed by TMA on Hopper): loads
past the edges return zeros and stores past them are dropped, so the main loop has no masks.

The epilogue multiplies by the scales (ROWWISE: `scale_a` [M, 1] per row and `scale_b` [1, N] per
column; else one scalar each), adds the bias (N elements, `stride_bias` apart) and stores in C's
dtype.  FAST_ACCUM lets `tl.dot` accumulate into the running sum; without it each K step's product is
added in float32, the tensor cores' partial sums promoted at least every MAX_IMPRECISE elements of K
(as in `scaled_mm_kernel.py`).  Descriptors need 16-byte-aligned bases and row strides (the template
checks them) and a scratch allocator (`triton.set_allocator`, set by the template before a launch).
M, N, K, the row strides and the swizzle GROUP_M are runtime arguments.  This file and
`common_kernel.py` are hashed into the template's `src_hash`.
"""

import triton
import triton.language as tl

from .common_kernel import swizzled_tile


@triton.jit
def _scaled(acc, SCALE_A, SCALE_B, BIAS, rm, rn, M, N, stride_bias, ROWWISE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The tile's float32 product with the scales applied and the bias added: the epilogue of
    `scaled_mm_kernel.py`, written again here because a kernel file imports device functions from
    `common_kernel.py` only (each template's `src_hash` is its kernel file and that one).  Change both."""
    if ROWWISE:
        scale_a = tl.load(SCALE_A + rm, mask=rm < M, other=0.0)
        scale_b = tl.load(SCALE_B + rn, mask=rn < N, other=0.0)
        acc = acc * scale_a[:, None] * scale_b[None, :]
    else:
        acc = acc * (tl.load(SCALE_A) * tl.load(SCALE_B))
    if HAS_BIAS:
        acc = acc + tl.load(BIAS + rn * stride_bias, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit(do_not_specialize=["GROUP_M"])
def scaled_tma_kernel(
    A, W, C, SCALE_A, SCALE_B, BIAS,
    M, N, K,
    stride_am, stride_wn, stride_cm, stride_bias,
    GROUP_M,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_SMS: tl.constexpr,
    ROWWISE: tl.constexpr, HAS_BIAS: tl.constexpr, FAST_ACCUM: tl.constexpr, MAX_IMPRECISE: tl.constexpr,
):
    a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(C, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    start = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    num_tiles = grid_m * grid_n
    # The epilogue recomputes its tile from its own counter, so the (flattened, software-pipelined)
    # main loop and the epilogue share no loop-carried value.
    tile_c = start - NUM_SMS

    for tile in tl.range(start, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = swizzled_tile(tile, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_steps):
            a = a_desc.load([off_m, kk * BLOCK_K])
            w = w_desc.load([off_n, kk * BLOCK_K])
            if FAST_ACCUM:
                acc = tl.dot(a, w.T, acc, out_dtype=tl.float32)
            else:
                acc += tl.dot(a, w.T, out_dtype=tl.float32, max_num_imprecise_acc=MAX_IMPRECISE)

        tile_c += NUM_SMS
        pid_m, pid_n = swizzled_tile(tile_c, grid_m, grid_n, GROUP_M)
        off_cm = pid_m * BLOCK_M
        off_cn = pid_n * BLOCK_N
        acc = _scaled(acc, SCALE_A, SCALE_B, BIAS, off_cm + tl.arange(0, BLOCK_M), off_cn + tl.arange(0, BLOCK_N),
                      M, N, stride_bias, ROWWISE, HAS_BIAS)
        c_desc.store([off_cm, off_cn], acc.to(C.dtype.element_ty))
