"""The table of bad (or unusual but valid) inputs that tests/test_validation.py runs through
`gemmtune.tune` and the eager ops: one `Case` per kind, as docs/RELIABILITY.md lists them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from gemmtune.core.errors import BackendError, InputError
from gemmtune.core.validate import ProblemTooLargeError


CORRECT = "correct"


@dataclass(frozen=True)
class Err:
    type: type
    needle: str  # a regex the message must match: names the argument and the problem


@dataclass(frozen=True)
class Case:
    kind: str
    op: str
    make: Callable[[], tuple[tuple, dict]]  # -> (positional tensors, keyword arguments)
    tune: Any  # Err, CORRECT, or None (not reachable through tune)
    eager: Any  # Err, CORRECT, or None (not reachable through the eager op's signature)
    skip: str | None = None


def T(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


class NegStride(torch.Tensor):
    """torch cannot build a negative stride (as_strided refuses), so a subclass reports one."""

    def stride(self, *args):
        return (-3, 1) if not args else (-3, 1)[args[0]]


def _neg_view(*shape):
    return torch.randn(*shape, dtype=torch.complex64).conj().imag  # real float32, negative bit set


def _fp8():
    return (T(4, 3).to(torch.float8_e4m3fn), T(3, 5).to(torch.float8_e4m3fn)), {}


def _quantized():
    q = torch.quantize_per_tensor(T(4, 3), 0.1, 0, torch.quint8)
    return (q, T(3, 5)), {}


def _nested():
    return (torch.nested.nested_tensor([T(4, 3), T(2, 3)]), T(3, 5)), {}


def _nan_inf():
    a, b = T(12, 9), T(9, 11)
    a[1, 2], a[3, :], b[4, 5], b[:, 7] = float("nan"), float("inf"), float("-inf"), float("nan")
    return (a, b), {}


def _nan_inf_operands_alpha_zero():
    (a, b), _ = _nan_inf()
    return (T(11), a, b), {"alpha": 0.0, "beta": 0.5}


def _nan_everywhere_alpha_beta_zero():
    (a, b), _ = _nan_inf()
    return (torch.full((12, 11), float("nan")), a, b), {"alpha": 0, "beta": 0}


def _overlapping():
    base = T(64)
    return (base.as_strided((10, 7), (1, 1)), base.as_strided((7, 6), (2, 1))), {}


_HUGE = 2**20  # a 2^20 x 2^20 float32 output: 4 TiB


def _too_large():
    a = torch.ones(1, 1).expand(_HUGE, 1)
    b = torch.ones(1, 1).expand(1, _HUGE)
    return (a, b), {}


fp8_skip = None if hasattr(torch, "float8_e4m3fn") else "this torch has no float8"
mkldnn_skip = None if torch.backends.mkldnn.is_available() else "no MKLDNN in this torch build"
NOTHING = Err(InputError, r"nothing to tune")

CASES = [
    # -- the op and the number of operands (the eager ops' signatures fix both) --
    Case("unknown_op", "conv", lambda: ((T(4, 3), T(3, 5)), {}), Err(InputError, r"op: unknown op 'conv'"), None),
    Case("op_not_a_string", ["mm"], lambda: ((T(4, 3), T(3, 5)), {}), Err(InputError, r"op: unknown op \['mm'\]"), None),
    Case("too_few_tensors", "mm", lambda: ((T(4, 3),), {}), Err(InputError, r"mm: expected 2 tensors \(mat1, mat2\), got 1"), None),
    Case("too_many_tensors", "addmm", lambda: ((T(5), T(4, 3), T(3, 5), T(5)), {}),
         Err(InputError, r"addmm: expected 3 tensors \(input, mat1, mat2\), got 4"), None),
    # -- ranks ---------------------------------------------------------------------
    Case("mm_mat1_rank_1d", "mm", lambda: ((T(3), T(3, 5)), {}), Err(InputError, r"mm: mat1 must be 2-D, got 1-D"), ...),
    Case("mm_mat2_rank_3d", "mm", lambda: ((T(4, 3), T(2, 3, 5)), {}), Err(InputError, r"mm: mat2 must be 2-D, got 3-D"), ...),
    Case("mm_4d_channels_last", "mm",
         lambda: ((T(1, 3, 4, 3).to(memory_format=torch.channels_last), T(3, 5)), {}),
         Err(InputError, r"mm: mat1 must be 2-D, got 4-D .*reshaped"), ...),
    Case("bmm_batch1_rank_2d", "bmm", lambda: ((T(4, 3), T(2, 3, 5)), {}), Err(InputError, r"bmm: batch1 must be 3-D, got 2-D"), ...),
    Case("bmm_batch2_rank_4d", "bmm", lambda: ((T(2, 4, 3), T(1, 2, 3, 5)), {}),
         Err(InputError, r"bmm: batch2 must be 3-D, got 4-D"), ...),
    Case("addmm_mat1_rank_3d", "addmm", lambda: ((T(5), T(1, 4, 3), T(3, 5)), {}),
         Err(InputError, r"addmm: mat1 must be 2-D, got 3-D"), ...),
    Case("addmm_mat2_rank_1d", "addmm", lambda: ((T(5), T(4, 3), T(3)), {}), Err(InputError, r"addmm: mat2 must be 2-D, got 1-D"), ...),
    Case("addmm_bias_rank_3d", "addmm", lambda: ((T(1, 4, 5), T(4, 3), T(3, 5)), {}),
         Err(InputError, r"addmm: input \(bias\) must be 0-, 1- or 2-D, got 3-D"), ...),
    # -- shapes that do not agree --------------------------------------------------------
    Case("mm_k_mismatch", "mm", lambda: ((T(4, 3), T(5, 3)), {}),
         Err(InputError, r"mm: inner dimensions differ: mat1 is \(4, 3\) and mat2 is \(5, 3\) \(K 3 != 5\)"), ...),
    Case("bmm_k_mismatch", "bmm", lambda: ((T(2, 4, 3), T(2, 4, 5)), {}),
         Err(InputError, r"bmm: inner dimensions differ: batch1 .* batch2"), ...),
    Case("addmm_k_mismatch", "addmm", lambda: ((T(5), T(4, 3), T(2, 5)), {}),
         Err(InputError, r"addmm: inner dimensions differ: mat1 .* mat2"), ...),
    Case("bmm_batch_mismatch", "bmm", lambda: ((T(2, 4, 3), T(3, 3, 5)), {}),
         Err(InputError, r"bmm: batch sizes differ: batch1 has 2, batch2 has 3"), ...),
    Case("addmm_bias_not_broadcastable", "addmm", lambda: ((T(7), T(4, 3), T(3, 5)), {}),
         Err(InputError, r"addmm: input \(bias\) of shape \(7,\) does not broadcast to the output \(4, 5\)"), ...),
    Case("addmm_bias_2d_wrong_shape", "addmm", lambda: ((T(4, 4), T(4, 3), T(3, 5)), {}),
         Err(InputError, r"addmm: input \(bias\) of shape \(4, 4\) does not broadcast"), ...),
    # -- dtypes ----------------------------------------------------------------------------
    Case("addmm_bias_wrong_dtype", "addmm", lambda: ((T(5, dtype=torch.float64), T(4, 3), T(3, 5)), {}),
         Err(InputError, r"addmm: input \(bias\) is torch.float64 but mat1 is torch.float32"), ...),
    Case("addmm_bias_int_dtype", "addmm", lambda: ((torch.ones(5, dtype=torch.int64), T(4, 3), T(3, 5)), {}),
         Err(InputError, r"addmm: input has dtype torch.int64"), ...),
    Case("mixed_float32_float64", "mm", lambda: ((T(4, 3), T(3, 5, dtype=torch.float64)), {}),
         Err(InputError, r"mm: mat1 is torch.float32 but mat2 is torch.float64; cast them to one dtype"), ...),
    Case("mixed_float16_bfloat16", "bmm",
         lambda: ((T(2, 4, 3, dtype=torch.float16), T(2, 3, 5, dtype=torch.bfloat16)), {}),
         Err(InputError, r"bmm: batch1 is torch.float16 but batch2 is torch.bfloat16"), ...),
    Case("int_dtype", "mm", lambda: ((torch.ones(4, 3, dtype=torch.int32), torch.ones(3, 5, dtype=torch.int32)), {}),
         Err(InputError, r"mm: mat1 has dtype torch.int32; gemmtune supports float16, bfloat16, float32, float64"), ...),
    Case("bool_dtype", "mm", lambda: ((torch.ones(4, 3, dtype=torch.bool), torch.ones(3, 5, dtype=torch.bool)), {}),
         Err(InputError, r"mm: mat1 has dtype torch.bool"), ...),
    Case("complex_dtype", "mm", lambda: ((T(4, 3, dtype=torch.complex64), T(3, 5, dtype=torch.complex64)), {}),
         Err(InputError, r"mm: mat1 has dtype torch.complex64"), ...),
    Case("fp8_dtype", "mm", _fp8, Err(InputError, r"mm: mat1 has unsupported dtype torch.float8_e4m3fn"), ..., fp8_skip),
    Case("quantized_dtype", "mm", _quantized, Err(InputError, r"mm: mat1 is quantized \(torch.quint8\)"), ...),
    # -- devices ---------------------------------------------------------------------------
    Case("mixed_devices_meta_cpu", "mm", lambda: ((T(4, 3).to("meta"), T(3, 5)), {}),
         Err(InputError, r"mm: tensors are on different devices \['cpu', 'meta'\]"), ...),
    Case("meta_device", "mm", lambda: ((T(4, 3).to("meta"), T(3, 5).to("meta")), {}),
         Err(InputError, r"mm: mat1 is on the meta device \(no data\)"), ...),
    # -- not tensors -----------------------------------------------------------------------------
    Case("non_tensor_list", "mm", lambda: (([[1.0, 2.0, 3.0]], T(3, 5)), {}),
         Err(InputError, r"mm: mat1 must be a torch.Tensor, got list; convert it with torch.tensor"), ...),
    Case("non_tensor_numpy", "mm", lambda: ((np.ones((4, 3), np.float32), T(3, 5)), {}),
         Err(InputError, r"mm: mat1 must be a torch.Tensor, got ndarray; convert it with torch.from_numpy"), ...),
    Case("non_tensor_none", "mm", lambda: ((T(4, 3), None), {}), Err(InputError, r"mm: mat2 must be a torch.Tensor, got NoneType"), ...),
    Case("non_tensor_scalar", "bmm", lambda: ((2.0, T(2, 3, 5)), {}), Err(InputError, r"bmm: batch1 must be a torch.Tensor, got float"), ...),
    Case("bias_python_float", "addmm", lambda: ((1.5, T(4, 3), T(3, 5)), {}),
         Err(InputError, r"addmm: input must be a torch.Tensor, got float"), ...),
    # -- layouts -------------------------------------------------------------------------------
    Case("sparse_coo", "mm", lambda: ((T(4, 3).to_sparse(), T(3, 5)), {}),
         Err(InputError, r"mm: mat1 must be a dense strided tensor, got layout torch.sparse_coo"), ...),
    Case("sparse_csr", "addmm", lambda: ((T(5), T(4, 3), T(3, 5).to_sparse_csr()), {}),
         Err(InputError, r"addmm: mat2 must be a dense strided tensor, got layout torch.sparse_csr"), ...),
    Case("mkldnn_layout", "mm", lambda: ((T(4, 3).to_mkldnn(), T(3, 5)), {}),
         Err(InputError, r"mm: mat1 must be a dense strided tensor, got layout torch._mkldnn"), ..., mkldnn_skip),
    Case("nested_tensor", "mm", _nested, Err(InputError, r"mm: mat1 is a nested tensor"), ...),
    Case("negative_stride", "mm", lambda: ((T(3, 3).as_subclass(NegStride), T(3, 5)), {}),
         Err(InputError, r"mm: mat1 has a negative stride \(-3, 1\)"), ...),
    # -- the scalars ----------------------------------------------------------------------------
    Case("alpha_nan", "addmm", lambda: ((T(5), T(4, 3), T(3, 5)), {"alpha": float("nan")}),
         Err(InputError, r"addmm: alpha must be a finite real number, got nan"), ...),
    Case("beta_inf", "addmm", lambda: ((T(5), T(4, 3), T(3, 5)), {"beta": float("-inf")}),
         Err(InputError, r"addmm: beta must be a finite real number, got -inf"), ...),
    Case("alpha_bool", "addmm", lambda: ((T(5), T(4, 3), T(3, 5)), {"alpha": True}),
         Err(InputError, r"addmm: alpha must be a finite real number, got bool True"), ...),
    Case("alpha_complex", "addmm", lambda: ((T(5), T(4, 3), T(3, 5)), {"alpha": 1 + 2j}),
         Err(InputError, r"addmm: alpha must be a finite real number, got complex"), ...),
    Case("beta_tensor", "addmm", lambda: ((T(5), T(4, 3), T(3, 5)), {"beta": torch.tensor(0.5)}),
         Err(InputError, r"addmm: beta must be a real number, got a tensor .*beta.item\(\)"), ...),
    Case("alpha_none", "addmm", lambda: ((T(5), T(4, 3), T(3, 5)), {"alpha": None}),
         Err(InputError, r"addmm: alpha must be a finite real number, got NoneType None"), ...),
    # -- other arguments -------------------------------------------------------------------------
    Case("unknown_backend", "mm", lambda: ((T(4, 3), T(3, 5)), {"backends": ("cublas",)}),
         Err(BackendError, r"backends: unknown family \['cublas'\]"), ...),
    Case("backends_not_a_sequence", "mm", lambda: ((T(4, 3), T(3, 5)), {"backends": 3}),
         None, Err(BackendError, r"backends: expected None, a string or a tuple of family names .* got int 3")),
    Case("bad_out_layout", "mm", lambda: ((T(4, 3), T(3, 5)), {"out_layout": "diagonal"}),
         Err(InputError, r"out_layout.*'diagonal'"), ...),
    # -- sizes ------------------------------------------------------------------------------------
    Case("beyond_memory", "mm", _too_large,
         Err(ProblemTooLargeError, r"mm: too large to tune on cpu: the output alone is 4,096.0 GiB"), ...),
    Case("zero_M", "mm", lambda: ((T(0, 3), T(3, 5)), {}), NOTHING, CORRECT),
    Case("zero_N", "addmm", lambda: ((T(4, 1), T(4, 3), T(3, 0)), {}), Err(InputError, r"nothing to tune, N=0"), CORRECT),
    Case("zero_K_addmm_is_beta_bias", "addmm", lambda: ((T(5), T(4, 0), T(0, 5)), {"beta": 2.5}),
         Err(InputError, r"nothing to tune, K=0"), CORRECT),
    Case("zero_K_mm_is_zeros", "mm", lambda: ((T(4, 0), T(0, 5)), {}), NOTHING, CORRECT),
    Case("zero_batch", "bmm", lambda: ((T(0, 4, 3), T(0, 3, 5)), {}), Err(InputError, r"nothing to tune, batch=0"), CORRECT),
    # -- valid inputs that look odd: correct results -----------------------------------------------
    Case("expanded_stride0_operands", "mm", lambda: ((T(1, 7).expand(9, 7), T(7, 1).expand(7, 6)), {}), CORRECT, CORRECT),
    Case("overlapping_strides", "mm", _overlapping, CORRECT, CORRECT),
    Case("expanded_bias", "addmm", lambda: ((T(1, 6).expand(9, 6), T(9, 7), T(7, 6)), {"beta": 0.5}), CORRECT, CORRECT),
    Case("transposed_operands", "mm", lambda: ((T(7, 9).t(), T(6, 7).t()), {}), CORRECT, CORRECT),
    Case("sliced_with_step", "bmm", lambda: ((T(2, 18, 14)[:, ::2, ::2], T(2, 21, 12)[:, 1::3, 2::2]), {}), CORRECT, CORRECT),
    Case("storage_offset", "addmm", lambda: ((T(8)[2:], T(10, 9)[1:, 2:], T(9, 8)[2:, 2:]), {}), CORRECT, CORRECT),
    Case("requires_grad", "mm", lambda: ((T(9, 7).requires_grad_(), T(7, 6).requires_grad_()), {}), CORRECT, CORRECT),
    Case("nan_inf_data", "mm", _nan_inf, CORRECT, CORRECT),
    Case("nan_bias_with_beta_zero", "addmm",
         lambda: ((torch.full((6,), float("nan")), T(9, 7), T(7, 6)), {"beta": 0.0}), CORRECT, CORRECT),
    Case("nan_inf_operands_with_alpha_zero", "addmm", _nan_inf_operands_alpha_zero, CORRECT, CORRECT),
    Case("nan_everywhere_alpha_beta_zero", "addmm", _nan_everywhere_alpha_beta_zero, CORRECT, CORRECT),
    Case("mm_alpha_not_one", "mm", lambda: ((T(4, 3), T(3, 5)), {"alpha": 2.0}),
         Err(InputError, r"mm: alpha and beta belong to addmm only \(got alpha=2.0, beta=1.0\)"), None),
    Case("bmm_beta_not_one", "bmm", lambda: ((T(2, 4, 3), T(2, 3, 5)), {"beta": 0.5}),
         Err(InputError, r"bmm: alpha and beta belong to addmm only \(got alpha=1.0, beta=0.5\)"), None),
    Case("bias_0d", "addmm", lambda: ((torch.tensor(0.75), T(9, 7), T(7, 6)), {}), CORRECT, CORRECT),
    Case("bias_column", "addmm", lambda: ((T(9, 1), T(9, 7), T(7, 6)), {"alpha": -1.5}), CORRECT, CORRECT),
    Case("alpha_numpy_scalar", "addmm", lambda: ((T(6), T(9, 7), T(7, 6)), {"alpha": np.float32(0.5), "beta": 2}),
         CORRECT, CORRECT),
    Case("negative_bit_view", "mm", lambda: ((_neg_view(9, 7), T(7, 6)), {}),
         Err(InputError, r"mm: mat1 is a lazy negation view .*resolve_neg\(\)"), CORRECT),
]
for _c in CASES:  # `...` in the eager column: same as tune
    if _c.eager is ...:
        object.__setattr__(_c, "eager", _c.tune)

ERROR_KINDS = {c.kind for c in CASES if isinstance(c.tune, Err) or isinstance(c.eager, Err)}
CORRECT_KINDS = {c.kind for c in CASES if CORRECT in (c.tune, c.eager)}
