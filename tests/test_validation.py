"""Every kind of bad (or unusual but valid) input, through `gemmtune.tune` AND the eager ops.

One row per kind (the test id is the kind, as listed in docs/RELIABILITY.md):
either a typed error whose message names the argument and the problem, or a
result equal to torch's.  NaN and Inf are data: they give torch's result.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import gemmtune
from gemmtune.core.errors import BackendError, InputError
from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.templates.cpu_numba import NumbaMMTemplate
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate
from gemmtune.templates.triton.mm import TritonMMTemplate
from gemmtune.core.validate import ProblemTooLargeError, available_bytes, tuning_bytes, validate_operands

from validation_cases import CASES, ERROR_KINDS, Err, T, _neg_view  # the table, one row per kind

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
