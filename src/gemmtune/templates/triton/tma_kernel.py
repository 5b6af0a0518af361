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

`tma_row_groups_kernel` stores such an output (2 bytes an element, B = W.t()) through TMA as well.
Read 8 rows at a time as one long row, the output is a [M // 8, 8N] matrix whose row stride is 16-byte
aligned; row 8i + j of the output is its columns [jN, jN + N) of long row i.  The kernel multiplies
each row group j (rows j, j + 8, ...: a 3-D descriptor of A) by W's rows from s_j on, s_j being the
first column at which row j's address is 16-byte aligned (W's row coordinate is free), so each whole
tile of group j starts at an aligned column of the long rows, ends inside the row, and goes out
through a descriptor.  Per group and block of long rows, the tile before s_j and the one or two after
the whole tiles are stored through masked pointers, and so are the last M % 8 rows (row-major tiles).

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


@triton.jit
def _group_tile(tile, grid_mi, inner, N, GROUP_M, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(j, i0, c0) of the tile-th whole tile: row group j, first long row i0, first output column c0
    (s_j plus whole tiles); each group has `inner` of them, every one inside every row."""
    pid_m, pid_n = swizzled_tile(tile, 8 * grid_mi, inner, GROUP_M)
    j = pid_m // grid_mi
    return j, (pid_m % grid_mi) * BLOCK_M, pid_n * BLOCK_N + (8 - (j * N) % 8) % 8


@triton.jit
def _group_dot(a_desc, b_desc, j, i0, c0, k_steps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """The fp32 tile of long rows i0, i0 + 1, ... of row group j (A's rows j + 8i) by W's rows from c0."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(k_steps):
        a = tl.reshape(a_desc.load([i0, j, kk * BLOCK_K]), (BLOCK_M, BLOCK_K))
        b = b_desc.load([c0, kk * BLOCK_K])
        acc = tl.dot(a, b.T, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit
def _masked_store(C, acc, rm, rn, M, N, BIAS, stride_biasm, stride_biasn, alpha, beta,
                  HAS_BIAS: tl.constexpr, SCALED: tl.constexpr):
    """The epilogue, then a store of rows `rm`, columns `rn` through pointers (none before column 0 or
    from row M or column N on)."""
    cols = tl.where(rn >= 0, rn, N)
    acc = alpha_bias(acc, BIAS, rm, cols, M, N, stride_biasm, stride_biasn, alpha, beta, HAS_BIAS, SCALED)
    tl.store(C + rm[:, None] * N + cols[None, :], acc.to(C.dtype.element_ty),
             mask=(rm[:, None] < M) & (cols[None, :] < N))


@triton.jit(do_not_specialize=["GROUP_M"])
def tma_row_groups_kernel(
    A, B, C, BIAS,
    M, N, K,
    stride_am, stride_b_row,
    stride_biasm, stride_biasn,
    alpha, beta,
    GROUP_M,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr, NUM_SMS: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    rows = M // 8  # long rows; the last M % 8 rows are the tail
    a_desc = tl.make_tensor_descriptor(A, shape=[tl.maximum(rows, 1), 8, K], strides=[8 * stride_am, stride_am, 1],
                                       block_shape=[BLOCK_M, 1, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(B, shape=[N, K], strides=[stride_b_row, 1], block_shape=[BLOCK_N, BLOCK_K])
    long_rows = _out_descriptor(C, tl.maximum(rows, 1), 8 * N, 8 * N, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
    grid_mi = tl.cdiv(rows, BLOCK_M)
    inner = (N - 7) // BLOCK_N  # whole tiles inside every row, whatever its s_j (< 8)
    k_steps = tl.cdiv(K, BLOCK_K)
    # The whole tiles: flattened and pipelined like the plain kernel, each stored through the long rows.
    tile_c = tl.program_id(0) - NUM_SMS
    for tile in tl.range(tl.program_id(0), 8 * grid_mi * inner, NUM_SMS, flatten=True):
        j, i0, c0 = _group_tile(tile, grid_mi, inner, N, GROUP_M, BLOCK_M, BLOCK_N)
        acc = _group_dot(a_desc, b_desc, j, i0, c0, k_steps, BLOCK_M, BLOCK_N, BLOCK_K, INPUT_PRECISION)
        tile_c += NUM_SMS
        j, i0, c0 = _group_tile(tile_c, grid_mi, inner, N, GROUP_M, BLOCK_M, BLOCK_N)
        rm = j + 8 * (i0 + tl.arange(0, BLOCK_M))
        rn = c0 + tl.arange(0, BLOCK_N)
        acc = alpha_bias(acc, BIAS, rm, rn, M, N, stride_biasm, stride_biasn, alpha, beta, HAS_BIAS, SCALED)
        _store(long_rows, acc, i0, j * N + c0, C.dtype.element_ty, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
    # Through masked pointers, never past a row's start or end: per group and block of long rows, the
    # tile before s_j and the one or two after the whole tiles; then the tail rows, a row-major tile a
    # BLOCK_N of columns.  Each program starts where the whole tiles left it.
    edges = 8 * grid_mi * 3
    tail = tl.cdiv(N, BLOCK_N) if M % 8 else 0
    programs = tl.num_programs(0)
    first = (tl.program_id(0) + programs - (8 * grid_mi * inner) % programs) % programs
    for tile in range(first, edges + tail, programs):
        if tile < edges:
            which = tile % 3
            j = (tile // 3) // grid_mi
            i0 = ((tile // 3) % grid_mi) * BLOCK_M
            c0 = (tl.where(which == 0, -1, inner + which - 1)) * BLOCK_N + (8 - (j * N) % 8) % 8
            if c0 < N:  # the second tile after the whole ones is often past the row
                acc = _group_dot(a_desc, b_desc, j, i0, c0, k_steps, BLOCK_M, BLOCK_N, BLOCK_K, INPUT_PRECISION)
                _masked_store(C, acc, j + 8 * (i0 + tl.arange(0, BLOCK_M)), c0 + tl.arange(0, BLOCK_N), 8 * rows,
                              N, BIAS, stride_biasm, stride_biasn, alpha, beta, HAS_BIAS, SCALED)  # not the tail
        else:
            c0 = (tile - edges) * BLOCK_N
            rm = rows * 8 + tl.arange(0, BLOCK_M)
            rk = tl.arange(0, BLOCK_K)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kk in range(k_steps):
                a = tl.load(A + rm[:, None] * stride_am + (kk * BLOCK_K + rk)[None, :],
                            mask=(rm[:, None] < M) & (kk * BLOCK_K + rk < K)[None, :], other=0.0)
                b = b_desc.load([c0, kk * BLOCK_K])
                acc = tl.dot(a, b.T, acc, input_precision=INPUT_PRECISION)
            _masked_store(C, acc, rm, c0 + tl.arange(0, BLOCK_N), M, N, BIAS, stride_biasm, stride_biasn,
                          alpha, beta, HAS_BIAS, SCALED)
