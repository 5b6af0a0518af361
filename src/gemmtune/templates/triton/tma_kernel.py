"""The Triton kernel behind the `triton_tma_persistent` template (Hopper and later).

A persistent GEMM: the grid holds at most one program per SM; each program walks the output
tiles `start, start + NUM_SMS, ...` in swizzled order (GROUP_M rows of tiles walked column by
column), so consecutive tiles share A and B in L2 and launch/prologue costs are paid once per
SM.  Operands move through device-side tensor descriptors (`tl.make_tensor_descriptor`, backed
by TMA on Hopper): loads past the matrix edges return zeros, stores past them are dropped, so
no masks are needed in the main loop.  A is row-major `[M, K]`; B is row-major `[K, N]`, or with
B_TRANS the rows of a `[N, K]` weight (B = W.t(), as in `nn.Linear`).  The output is row-major:
stored through a descriptor too where its rows are 16-byte aligned (TMA_STORE), else with masked
pointer stores, so a vocabulary head whose N is not a multiple of 8 still loads through TMA.

Every descriptor needs a 16-byte-aligned base and 16-byte-aligned row strides (the template
checks this); creating descriptors on the device needs a scratch allocator
(`triton.set_allocator`, set by the template before each launch).

M, N, K, the row strides, alpha/beta and the swizzle GROUP_M are runtime arguments; GROUP_M is
excluded from specialisation so every swizzle shares one binary.  This file and `common_kernel.py`
are hashed into the template's `src_hash`.
"""

import triton
import triton.language as tl

from .common_kernel import alpha_bias, store_tile, swizzled_tile


@triton.jit
def _descriptors(A, B, M, N, K, stride_am, stride_b_row,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, B_TRANS: tl.constexpr):
    """Device-side TMA descriptors of A and B (or W for B = W.t()), in the kernel's block shapes."""
    a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_TRANS:
        b_desc = tl.make_tensor_descriptor(B, shape=[N, K], strides=[stride_b_row, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(B, shape=[K, N], strides=[stride_b_row, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    return a_desc, b_desc


@triton.jit
def _out_descriptor(C, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    EPILOGUE_SUBTILE: tl.constexpr):
    """The output's TMA descriptor: whole tiles, or half-width ones with EPILOGUE_SUBTILE."""
    if EPILOGUE_SUBTILE:
        c_desc = tl.make_tensor_descriptor(C, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N // 2])
    else:
        c_desc = tl.make_tensor_descriptor(C, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    return c_desc


@triton.jit
def _store(c_desc, acc, off_cm, off_cn, out_ty: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           EPILOGUE_SUBTILE: tl.constexpr):
    """Store the tile through `c_desc`: whole, or as two half-width tiles (half the shared-memory
    staging buffer, room for a pipeline stage more)."""
    if EPILOGUE_SUBTILE:
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        acc0, acc1 = tl.split(halves)
        c_desc.store([off_cm, off_cn], acc0.to(out_ty))
        c_desc.store([off_cm, off_cn + BLOCK_N // 2], acc1.to(out_ty))
    else:
        c_desc.store([off_cm, off_cn], acc.to(out_ty))


@triton.jit(do_not_specialize=["GROUP_M"])
def tma_persistent_kernel(
    A, B, C, BIAS,
    M, N, K,
    stride_am, stride_b_row, stride_cm,
    stride_biasm, stride_biasn,
    alpha, beta,
    GROUP_M,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    B_TRANS: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, NUM_SMS: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, INPUT_PRECISION: tl.constexpr, TMA_STORE: tl.constexpr,
):
    a_desc, b_desc = _descriptors(A, B, M, N, K, stride_am, stride_b_row, BLOCK_M, BLOCK_N, BLOCK_K, B_TRANS)
    if TMA_STORE:
        c_desc = _out_descriptor(C, M, N, stride_cm, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
    start = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    num_tiles = grid_m * grid_n
    # The epilogue recomputes its tile from its own counter, so the (flattened, software-
    # pipelined) main loop and the epilogue share no loop-carried value.
    tile_c = start - NUM_SMS

    for tile in tl.range(start, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = swizzled_tile(tile, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_steps):
            off_k = kk * BLOCK_K
            a = a_desc.load([off_m, off_k])
            if B_TRANS:
                b = b_desc.load([off_n, off_k])
                acc = tl.dot(a, b.T, acc, input_precision=INPUT_PRECISION)
            else:
                b = b_desc.load([off_k, off_n])
                acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        tile_c += NUM_SMS
        pid_m, pid_n = swizzled_tile(tile_c, grid_m, grid_n, GROUP_M)
        off_cm = pid_m * BLOCK_M
        off_cn = pid_n * BLOCK_N
        rm = off_cm + tl.arange(0, BLOCK_M)
        rn = off_cn + tl.arange(0, BLOCK_N)
        if TMA_STORE:
            acc = alpha_bias(acc, BIAS, rm, rn, M, N, stride_biasm, stride_biasn, alpha, beta, HAS_BIAS, SCALED)
            _store(c_desc, acc, off_cm, off_cn, C.dtype.element_ty, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
        else:
            store_tile(acc, C, BIAS, rm, rn, 0, M, N, 0, stride_cm, 1, stride_biasm, stride_biasn,
                       alpha, beta, HAS_BIAS, SCALED)
