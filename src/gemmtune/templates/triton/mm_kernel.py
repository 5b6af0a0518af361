"""The Triton GEMM kernel behind the `triton_mm` template.

M, every stride, alpha/beta and the tile swizzle GROUP_M are runtime arguments;
N and K are compile-time (N_FIXED, K_FIXED), so one compiled binary per (tile
config, N, K, stride alignment, EVEN_K) serves every M and every swizzle.  EVEN_K (K a multiple of
BLOCK_K) drops the K mask from the main loop.  GROUP_M is excluded from Triton's
integer specialisation so that swizzle=1 does not trigger a second compile.
This file and `common_kernel.py` are hashed into the template's `src_hash`.
"""

import triton
import triton.language as tl

from .common_kernel import dot_k_range, store_tile, swizzled_tile


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
    DIV_AM: tl.constexpr, DIV_AK: tl.constexpr, DIV_BK: tl.constexpr, DIV_BN: tl.constexpr,
    DIV_CM: tl.constexpr, DIV_CN: tl.constexpr, N_FIXED: tl.constexpr, K_FIXED: tl.constexpr,
    N_WRAP: tl.constexpr, HINT_M: tl.constexpr, HINT_N: tl.constexpr, CLAMP_M: tl.constexpr,
):
    # N and K are the binary's own (its launcher passes its problem's): as literals, the K loop's trip
    # count, its masks and the column wrap below fold at compile time.
    N = N_FIXED
    K = K_FIXED
    # Each stride is a multiple of its DIV_* (a power of two up to 16, found on the host): written so,
    # the compiler knows it, and rows of 16-byte-aligned but not 16-element-aligned matrices (K = 72,
    # N = 20) still load and store in vectors, as a literal stride would let them.  The output's row
    # stride is N's (a row-major output), so a narrow output (N = 24) is stored in vectors too.
    stride_am, stride_ak = stride_am // DIV_AM * DIV_AM, stride_ak // DIV_AK * DIV_AK
    stride_bk, stride_bn = stride_bk // DIV_BK * DIV_BK, stride_bn // DIV_BN * DIV_BN
    stride_cm, stride_cn = stride_cm // DIV_CM * DIV_CM, stride_cn // DIV_CN * DIV_CN
    pid = tl.program_id(0)
    pid_z = tl.program_id(1).to(tl.int64)
    pid_m, pid_n = swizzled_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows/columns past the edge wrap around: loads stay in bounds without a
    # mask on M/N; the store is masked, so wrapped values are never written.
    # The hints keep the wrapped indices contiguous for the compiler (vector loads) in runs of HINT_M /
    # HINT_N, which divide the wrap (mm.index_hints): no vector spans it.  N_WRAP is N, or on a padded
    # twin's whole rows N rounded up to the rows' alignment (the columns past N read there are dropped).
    # A row-major A's rows past M are clamped to its last row instead (CLAMP_M): one min, where the wrap
    # divides by the runtime M for every row, a cost that shows on a tall problem with a tiny K.
    if CLAMP_M:
        ram = tl.max_contiguous(tl.multiple_of(tl.minimum(rm, M - 1), HINT_M), HINT_M)
    else:
        ram = tl.max_contiguous(tl.multiple_of(rm % M, HINT_M), HINT_M)
    rbn = tl.max_contiguous(tl.multiple_of(rn % N_WRAP, HINT_N), HINT_N)
    acc = dot_k_range(A, B, pid_z, ram, rbn, 0, tl.cdiv(K, BLOCK_K), K, stride_az, stride_am, stride_ak,
                      stride_bz, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INPUT_PRECISION)
    store_tile(acc, C, BIAS, rm, rn, pid_z, M, N, stride_cz, stride_cm, stride_cn, stride_biasm, stride_biasn,
               alpha, beta, HAS_BIAS, SCALED)
