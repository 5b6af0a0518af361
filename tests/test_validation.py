"""Every kind of bad (or unusual but valid) input, through `gemmtune.tune` AND the eager ops.

One row per kind (the test id is the kind, as listed in docs/RELIABILITY.md):
either a typed error whose message names the argument and the problem, or a
result equal to torch's.  NaN and Inf are data: they give torch's result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

import gemmtune
from gemmtune.core.errors import BackendError, InputError
from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.templates.cpu_numba import NumbaMMTemplate
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate
from gemmtune.templates.triton.mm import TritonMMTemplate
from gemmtune.core.validate import ProblemTooLargeError, available_bytes, tuning_bytes, validate_operands

DOC = Path(__file__).resolve().parents[1] / "docs" / "RELIABILITY.md"
FAST = gemmtune.Settings(store="off", cpu_rep_ms=1, finalist_rounds=1)
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),  # nested/quantized prototype warnings
              pytest.mark.filterwarnings("error::RuntimeWarning")]  # NaN/Inf data: no NumPy warning may reach the user


@pytest.fixture(autouse=True)
def _small_pool(monkeypatch):
    """Library kernels plus a one-config numba template (compiled once, cached on disk): fast and still generated."""
    import gemmtune.templates.registry as templates

    monkeypatch.setattr(templates, "default_templates", lambda *args, **kwargs: [
        AtenTemplate("mm"), AtenTemplate("addmm"), AtenTemplate("bmm"), NumpyTemplate(),
        NumbaMMTemplate(space=[(8, 64, 8)])])
    monkeypatch.setenv("GEMMTUNE_CPU_REP_MS", "1")
    monkeypatch.setenv("GEMMTUNE_FINALIST_ROUNDS", "1")


# -- the table ------------------------------------------------------------------------------------

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


def _params(path):
    return [pytest.param(c, id=c.kind, marks=[pytest.mark.skip(reason=c.skip)] if c.skip else [])
            for c in CASES if getattr(c, path) is not None]


# -- running a case ---------------------------------------------------------------------------------

def _torch_result(op, tensors, kw):
    ts = [t.detach().resolve_neg() for t in tensors]
    if op == "mm":
        return torch.mm(*ts)
    if op == "bmm":
        return torch.bmm(*ts)
    return torch.addmm(*ts, alpha=float(kw.get("alpha", 1)), beta=float(kw.get("beta", 1)))


def _same(out, want):
    assert out.shape == want.shape
    torch.testing.assert_close(out.detach(), want, equal_nan=True)  # NaN where torch has NaN, nowhere else


def _run(path, case):
    tensors, kw = case.make()
    if path == "tune":
        sel = gemmtune.tune(case.op, *tensors, settings=FAST, **kw)
        return sel, tensors, kw, sel(*tensors)
    return None, tensors, kw, getattr(gemmtune, case.op)(*tensors, **kw)


@pytest.mark.parametrize("case", _params("tune"))
def test_tune(case):
    if isinstance(case.tune, Err):
        with pytest.raises(case.tune.type, match=case.tune.needle):
            _run("tune", case)
        return
    sel, tensors, kw, out = _run("tune", case)
    _same(out, _torch_result(case.op, tensors, kw))
    # The correctness gate judged every candidate on these inputs: none may be rejected for them
    # (NaN/Inf data, expanded or overlapping operands are valid; a rejection would be a false alarm).
    wrong = [(t.choice.name, t.detail) for t in sel.timings if t.status == "wrong_result"]
    assert not wrong, wrong


@pytest.mark.parametrize("case", _params("eager"))
def test_eager(case):
    if isinstance(case.eager, Err):
        with pytest.raises(case.eager.type, match=case.eager.needle):
            _run("eager", case)
        return
    _, tensors, kw, out = _run("eager", case)
    want = _torch_result(case.op, tensors, kw)
    _same(out, want)
    again = getattr(gemmtune, case.op)(*tensors, **kw)  # the warm path gives the same
    _same(again, want)


# -- kinds that need more than one call -----------------------------------------------------------------

def test_there_are_at_least_30_kinds_of_bad_input():
    assert len(ERROR_KINDS) >= 30, sorted(ERROR_KINDS)


def test_input_error_is_a_value_error_and_too_large_is_also_a_memory_error():
    assert issubclass(InputError, ValueError) and issubclass(BackendError, ValueError)
    assert issubclass(ProblemTooLargeError, InputError) and issubclass(ProblemTooLargeError, MemoryError)


def test_torch_itself_cannot_build_negative_strides():
    with pytest.raises(RuntimeError, match="[Nn]egative strides"):
        torch.randn(9).as_strided((3, 3), (-1, 1))


def test_requires_grad_eager_gradients_match_torch():
    a, b = T(9, 7).requires_grad_(), T(7, 6).requires_grad_()
    gemmtune.mm(a, b).sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    torch.mm(a, b).sum().backward()
    torch.testing.assert_close(ga, a.grad)
    torch.testing.assert_close(gb, b.grad)


def test_negative_bit_view_on_the_warm_path_of_a_generated_winner():
    """A problem first tuned with ordinary tensors, then called with a lazy negation view of the same metadata."""
    a, b = T(20, 24)[:, ::2], T(12, 9)  # strides (24, 2): those of the real part of a complex [20, 12]
    gemmtune.mm(a, b, backends=("numba",))  # a generated kernel wins (the only family asked for)
    neg = _neg_view(20, 12)
    assert neg.shape == a.shape and neg.stride() == a.stride()
    hits = gemmtune.dispatch_stats()["hits"]
    _same(gemmtune.mm(neg, b, backends=("numba",)), torch.mm(neg.resolve_neg(), b))
    assert gemmtune.dispatch_stats()["hits"] == hits + 1  # served by the warm path


def test_bad_input_after_a_tuned_problem_is_still_validated():
    a, b = T(4, 3), T(3, 5)
    gemmtune.mm(a, b, backends=("extern",))
    with pytest.raises(InputError, match="mat2 must be a torch.Tensor"):
        gemmtune.mm(a, b.numpy(), backends=("extern",))
    with pytest.raises(InputError, match="mat1 must be a dense strided tensor"):
        gemmtune.mm(a.to_sparse(), b, backends=("extern",))


@pytest.mark.parametrize("backends", [("extern",), ("numba",)])
def test_the_warm_path_refuses_what_the_cold_path_refuses(backends):
    """After a warm-up (the problem is in the dispatch dict) the same refusals as on a first call."""
    bias, a, b, x, y = T(5), T(4, 3), T(3, 5), T(2, 4, 3), T(2, 3, 5)
    gemmtune.addmm(bias, a, b, backends=backends)
    gemmtune.mm(a, b, backends=backends)
    gemmtune.bmm(x, y, backends=backends)
    for kw, needle in (({"alpha": True}, "alpha must be a finite real number, got bool True"),
                       ({"alpha": 1 + 0j}, r"alpha must be a finite real number, got complex \(1\+0j\)"),
                       ({"beta": True}, "beta must be a finite real number, got bool True"),
                       ({"beta": 1 + 0j}, "beta must be a finite real number, got complex")):
        with pytest.raises(InputError, match=needle):
            gemmtune.addmm(bias, a, b, backends=backends, **kw)
    with pytest.raises(InputError, match=r"mm: tensors are on different devices \['cpu', 'meta'\]"):
        gemmtune.mm(a, b.to("meta"), backends=backends)
    with pytest.raises(InputError, match="mm: mat1 is on the meta device"):
        gemmtune.mm(a.to("meta"), b.to("meta"), backends=backends)
    with pytest.raises(InputError, match=r"bmm: tensors are on different devices \['cpu', 'meta'\]"):
        gemmtune.bmm(x, y.to("meta"), backends=backends)
    with pytest.raises(InputError, match=r"addmm: tensors are on different devices \['cpu', 'meta'\]"):
        gemmtune.addmm(bias.to("meta"), a, b, backends=backends)
    _same(gemmtune.addmm(bias, a, b, alpha=1, beta=1.0, backends=backends), torch.addmm(bias, a, b))


@pytest.mark.parametrize("backends", [("extern",), ("numba",)])
def test_a_selection_refuses_operands_of_another_problem(backends):
    a, b = T(64, 48), T(48, 80)
    sel = gemmtune.tune("mm", a, b, backends=backends, settings=FAST)
    foreign = [((T(8, 48), b), "tuned for mat1 of shape (64, 48), strides (48, 1), torch.float32 on cpu; got shape (8, 48)"),
               ((T(2, 2), T(2, 2)), "got shape (2, 2)"),
               ((a.double(), b.double()), "torch.float64 on cpu: tune that problem"),
               ((a, T(80, 48).t()), "tuned for mat2 of shape (48, 80), strides (80, 1), torch.float32 on cpu; got shape "
                                    "(48, 80), strides (1, 48)"),
               ((a, b.to("meta")), "torch.float32 on meta"),
               ((a,), "takes 2 operands, got 1"),
               ((a, b.numpy()), "mat2 must be a torch.Tensor, got ndarray"),
               ((a, _neg_view(48, 80)), "mat2 is a lazy negation view")]
    for args, needle in foreign:
        with pytest.raises(InputError, match=re.escape(needle)):
            sel(*args)
    _same(sel(a, b), torch.mm(a, b))
    bias, x, y = T(80), T(2, 64, 48), T(2, 48, 80)
    sel = gemmtune.tune("addmm", bias, a, b, backends=backends, settings=FAST)
    with pytest.raises(InputError, match=re.escape("tuned for input of shape (80,)")):
        sel(T(64, 80), a, b)
    _same(sel(bias, a, b), torch.addmm(bias, a, b))
    sel = gemmtune.tune("bmm", x, y, backends=backends, settings=FAST)
    with pytest.raises(InputError, match=re.escape("tuned for batch1 of shape (2, 64, 48)")):
        sel(T(3, 64, 48), T(3, 48, 80))
    _same(sel(x, y), torch.bmm(x, y))


def test_beyond_memory_is_checked_against_the_free_memory(monkeypatch):
    """A problem that fits in RAM by size but not in what is free: typed error before allocating."""
    import gemmtune.core.validate as v

    a, b = torch.ones(1, 1).expand(8192, 8192), torch.ones(1, 1).expand(8192, 8192)
    need = tuning_bytes("mm", [a, b])
    assert need == 8192 * 8192 * (4 + 8) + 8 * 2 * 8192 * 8192
    monkeypatch.setattr(v, "available_bytes", lambda device: need - 1)
    with pytest.raises(ProblemTooLargeError, match=r"only .* is free"):
        validate_operands("mm", [a, b])
    with pytest.raises(MemoryError):
        gemmtune.mm(a, b)
    monkeypatch.setattr(v, "available_bytes", lambda device: need)
    validate_operands("mm", [a, b])
    validate_operands("mm", [a, b], check_memory=False)


def test_available_bytes_on_cpu_is_a_positive_number():
    have = available_bytes(torch.device("cpu"))
    assert have is None or have > 0
    assert available_bytes(torch.device("meta")) is None


def test_triton_template_excludes_problems_of_2_pow_31_elements():
    """32-bit in-matrix offsets: the Triton template is not offered (the library kernels still are).

    Described without data (TensorMeta): no 4 GiB tensor is allocated.
    """
    from gemmtune.templates.triton.base import triton_available

    if not triton_available():
        pytest.skip("triton is not installed")
    b = TensorMeta((2**15, 64), (64, 1), torch.float16, "cuda:0")
    big = KernelInputs("mm", (TensorMeta((2**16, 2**15), (2**15, 1), torch.float16, "cuda:0"), b))
    fits = KernelInputs("mm", (TensorMeta((2**15, 2**15), (2**15, 1), torch.float16, "cuda:0"), b))
    assert big.M * big.K == 2**31 and fits.M * fits.K == 2**30
    assert not TritonMMTemplate().supports(big)
    assert TritonMMTemplate().supports(fits)
    assert AtenTemplate("mm").supports(big)


def test_tune_bad_device_argument_is_an_input_error():
    with pytest.raises(InputError, match="device"):
        gemmtune.tune("mm", T(4, 3), T(3, 5), device="gpu0", settings=FAST)


def test_tune_backends_not_a_sequence_is_a_backend_error():
    with pytest.raises(BackendError, match="backends"):
        gemmtune.tune("mm", T(4, 3), T(3, 5), backends=3, settings=FAST)


def test_tune_requires_grad_with_library_kernels_only():
    a, b = T(9, 7).requires_grad_(), T(7, 6)
    sel = gemmtune.tune("mm", a, b, backends=("extern",), settings=FAST)
    _same(sel(a, b), torch.mm(a, b))


def test_float16_overflow_is_data_not_a_wrong_result():
    a, b = (T(24, 16) * 300).half(), (T(16, 20) * 300).half()
    want = torch.mm(a, b)
    assert torch.isinf(want).any()
    sel = gemmtune.tune("mm", a, b, backends=("extern",), settings=FAST)
    _same(sel(a, b), want)


# -- the doc lists every kind ----------------------------------------------------------------------------

def test_reliability_doc_lists_every_kind():
    text = DOC.read_text()
    rows = set(re.findall(r"^\| `([A-Za-z0-9_]+)` \|", text, flags=re.M))
    missing = {c.kind for c in CASES} - rows
    assert not missing, f"docs/RELIABILITY.md lacks rows for {sorted(missing)}"


def test_l2_flush_setting_is_validated_and_read_from_env():
    import gemmtune

    assert gemmtune.Settings().l2_flush == "read"
    assert gemmtune.Settings.from_env({"GEMMTUNE_L2_FLUSH": "write"}).l2_flush == "write"
    with pytest.raises(ValueError, match="l2_flush: expected one of read, write, got 'dirty'"):
        gemmtune.Settings(l2_flush="dirty")
