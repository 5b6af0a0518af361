"""Triton kernel of `templates.staging.block_copy`: a matrix (or a batch of them) copied between storage
of different row strides, such as an operand into the top-left block of its zero-padded storage.

Elements are numbered in the order of the side whose rows are packed (`SRC_FLAT` or `DST_FLAT`): that side
is read or written as one run of memory, in 16-byte vectors wherever its start is aligned, and the other side's
offset (batch `b`, row `r`, column `c`) is worked out per element.  A misaligned row stride (a bf16 row of
5555 elements) stops torch's copy from using vectors on either side.
"""

import triton
import triton.language as tl


@triton.jit
def block_copy_kernel(
    SRC, DST, numel, R, C,
    s_b, s_r, d_b, d_r,
    BLOCK: tl.constexpr, SRC_FLAT: tl.constexpr, DST_FLAT: tl.constexpr,
):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < numel
    c = idx % C
    rows = idx // C
    r = rows % R
    b = rows // R
    if SRC_FLAT:
        src_at = idx
    else:
        src_at = b * s_b + r * s_r + c
    if DST_FLAT:
        dst_at = idx
    else:
        dst_at = b * d_b + r * d_r + c
    tl.store(DST + dst_at, tl.load(SRC + src_at, mask=mask), mask=mask)
