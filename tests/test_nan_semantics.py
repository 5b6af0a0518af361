"""torch.addmm's scalar semantics, NaN and Inf: the float64 reference, every CPU kernel and the gate.

torch.addmm does not compute A @ B when alpha == 0 (NaN and Inf in A or B do not reach the output) and
ignores the bias when beta == 0.  The reference the gate compares against must do the same, or a kernel
that computes 0 x NaN passes the gate and the pick depends on timing; every kernel must do the same, or
the user gets NaN rows.  NumPy's floating-point warnings on NaN/Inf data must not reach the user.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import gemmtune
from gemmtune.measure.correctness import Reference, check, reference, verdict
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.cpu_numba import NumbaMMTemplate
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate

FAST = gemmtune.Settings(store="off", cpu_rep_ms=1, finalist_rounds=1, min_reps=1, max_reps=3)
NUMBA_SMALL = [(8, 64, 8)]
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # no NumPy "invalid value" warning may escape


def poisoned(M=8, K=4, N=16):
    """(bias, a, b) with NaN and +-Inf in both operands (NaN in row 2 of A, Inf in a column of B)."""
    bias, a, b = torch.randn(N), torch.randn(M, K), torch.randn(K, N)
    a[2, 1] = float("nan")
    a[5, 0] = float("inf")
    b[3, 7] = float("-inf")
    return bias, a, b


SCALARS = [(0.0, 1.0), (0.0, 0.0), (0.0, -2.0), (1.0, 0.0), (2.0, 1.0), (-0.5, 0.0)]


@pytest.mark.parametrize("alpha,beta", SCALARS)
def test_reference_follows_torch_addmm(alpha, beta):
    bias, a, b = poisoned()
    bias[4] = float("nan")
    ki = KernelInputs.from_tensors("addmm", bias, a, b, alpha=alpha, beta=beta)
    want = torch.addmm(bias.double(), a.double(), b.double(), alpha=alpha, beta=beta)
    torch.testing.assert_close(reference(ki, (bias, a, b)), want, equal_nan=True)


@pytest.mark.parametrize("alpha,beta", SCALARS)
@pytest.mark.parametrize("template", [AtenTemplate("addmm"), NumpyTemplate(), NumbaMMTemplate(space=NUMBA_SMALL)],
                         ids=lambda t: t.uid)
def test_every_cpu_kernel_follows_torch_addmm(template, alpha, beta):
    bias, a, b = poisoned()
    bias[4] = float("nan")
    ki = KernelInputs.from_tensors("addmm", bias, a, b, alpha=alpha, beta=beta)
    want = torch.addmm(bias, a, b, alpha=alpha, beta=beta)
    for choice in template.configs(ki)[:1]:
        out = torch.full(ki.out_size, float("nan"))  # poisoned: every element must be written
        template.compile(choice, ki, (bias, a, b))((bias, a, b), out, **choice.runtime_dict)
        torch.testing.assert_close(out, want, equal_nan=True)
        assert check(ki, out, reference(ki, (bias, a, b))) is None


def test_the_gate_rejects_nan_rows_when_alpha_is_zero():
    bias, a, b = poisoned()
    ki = KernelInputs.from_tensors("addmm", bias, a, b, alpha=0.0)
    ref = Reference.of(ki, (bias, a, b))
    nan_rows = bias.expand(8, 16).clone()
    nan_rows[2] = float("nan")  # what a kernel computing 0 * (A @ B) gives
    assert verdict(ki, nan_rows, ref) == "16 elements NaN or unwritten"


def test_the_gate_rejects_an_output_that_drops_nan_or_inf():
    _, a, b = poisoned()
    ki = KernelInputs.from_tensors("mm", a, b)
    exact = reference(ki, (a, b))
    dropped = torch.nan_to_num(torch.mm(a, b), nan=0.0)
    assert check(ki, dropped, exact).endswith("not NaN where the reference is NaN")
    finite = torch.mm(a, b)
    finite[torch.isinf(finite)] = 1.0
    assert check(ki, finite, exact) == "elements that are infinite in the reference differ from it"
    assert check(ki, torch.mm(a, b), exact) is None


@pytest.mark.parametrize("backends", [("numba",), ("extern",)])
@pytest.mark.parametrize("alpha,beta", [(0.0, 1.0), (0.0, 0.0), (1.0, 0.0)])
def test_tune_and_eager_give_torch_addmm(monkeypatch, backends, alpha, beta):
    import gemmtune.templates.registry as registry

    monkeypatch.setattr(registry, "default_templates", lambda *args, **kwargs: [
        AtenTemplate("addmm"), NumpyTemplate(), NumbaMMTemplate(space=NUMBA_SMALL)])
    bias, a, b = poisoned()
    bias[0] = float("nan")
    want = torch.addmm(bias, a, b, alpha=alpha, beta=beta)
    sel = gemmtune.tune("addmm", bias, a, b, alpha=alpha, beta=beta, backends=backends, settings=FAST)
    assert all(t.status == "ok" for t in sel.timings), [(t.choice.name, t.detail) for t in sel.timings]
    torch.testing.assert_close(sel(bias, a, b), want, equal_nan=True)
    monkeypatch.setenv("GEMMTUNE_STORE", "off")
    for _ in range(2):  # cold, then warm
        out = gemmtune.addmm(bias, a, b, alpha=alpha, beta=beta, backends=backends)
        torch.testing.assert_close(out, want, equal_nan=True)


def test_numpy_warnings_do_not_reach_the_user_while_tuning():
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    a[0, 0], a[1, 0] = float("inf"), float("-inf")  # Inf * 0 and Inf - Inf: NumPy's "invalid value"
    b[0, 3] = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sel = gemmtune.tune("mm", a, b, backends=("extern", "numpy"), settings=FAST,
                            templates=[AtenTemplate("mm"), NumpyTemplate()])
        assert {t.choice.template_uid for t in sel.timings if t.status == "ok"} == {"aten_mm", "numpy_blas"}
        numpy_choice = next(t.choice for t in sel.timings if t.choice.template_uid == "numpy_blas")
        out = NumpyTemplate().compile(numpy_choice, sel.problem, (a, b))((a, b))  # a warm call: no warning either
    torch.testing.assert_close(out, torch.mm(a, b), equal_nan=True)
