"""Autocast: gemmtune's ops and patched nn.Linear return torch's dtype under torch.autocast, on every backend."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.core.errors import NoCandidatesError
from gemmtune.core.settings import FAMILIES
from helpers import compiled_op_under_autocast, patched_linear_under_autocast

CPU_FAMILIES = [f for f in FAMILIES if f != "triton"]


pytestmark = pytest.mark.usefixtures("memory_store")


def _operands(op):
    g = torch.Generator().manual_seed(0)
    if op == "bmm":
        return (torch.randn(2, 16, 8, generator=g), torch.randn(2, 8, 12, generator=g))
    if op == "addmm":
        return (torch.randn(12, generator=g), torch.randn(16, 8, generator=g), torch.randn(8, 12, generator=g))
    return (torch.randn(16, 8, generator=g), torch.randn(8, 12, generator=g))


@pytest.mark.parametrize("family", CPU_FAMILIES)
@pytest.mark.parametrize("op", ["mm", "addmm", "bmm"])
def test_autocast_result_has_torchs_dtype_on_every_cpu_backend(op, family):
    args = _operands(op)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = getattr(torch, op)(*args)
        try:
            got = getattr(gemmtune, op)(*args, backends=(family,))
        except NoCandidatesError as exc:  # numba runs float32/float64 only: a clear error, never a wrong dtype
            assert family != "extern" and "bfloat16" in str(exc)
            return
    assert ref.dtype == torch.bfloat16
    assert got.dtype == ref.dtype
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm"])
def test_autocast_tunes_the_cast_problem_and_default_backends_match_torch(op):
    args = _operands(op)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = getattr(gemmtune, op)(*args)
        again = getattr(gemmtune, op)(*args)  # warm path: same dtype
    assert got.dtype == again.dtype == torch.bfloat16
    assert all("bfloat16" in problem for problem in gemmtune.dispatch_stats()["selections"])
    assert getattr(gemmtune, op)(*args).dtype == torch.float32  # autocast off again: the float32 problem


def test_autocast_leaves_float64_alone_as_torch_does():
    a, b = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert gemmtune.mm(a, b, backends=("numba",)).dtype == torch.mm(a, b).dtype == torch.float64


@pytest.mark.parametrize("bias", [True, False])
def test_patched_linear_under_autocast_matches_nn_linear(bias):
    torch.manual_seed(0)
    lin = nn.Linear(8, 6, bias=bias)
    got, ref = patched_linear_under_autocast(lin, torch.randn(3, 5, 8), "cpu", ("extern",))
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert all("bfloat16" in p for p in gemmtune.dispatch_stats()["selections"])  # the cast problem was tuned


def test_patched_linear_with_numba_only_under_autocast_is_a_clear_error_not_float32():
    lin = gemmtune.patch(nn.Linear(8, 6), backends=("numba",))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(NoCandidatesError, match="bfloat16"):
        lin(torch.randn(3, 8))


def test_autocast_gradients_flow_to_float32_leaves():
    a = torch.randn(16, 8, requires_grad=True)
    b = torch.randn(8, 12, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = gemmtune.mm(a, b, backends=("extern",))
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and a.grad.dtype == torch.float32 and a.grad.shape == a.shape


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm"])
def test_autocast_under_torch_compile_matches_torch(op):
    got, ref = compiled_op_under_autocast(op, _operands(op), "cpu", ("extern",), backend="eager")
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_autocast_under_torch_compile_with_an_opaque_numba_only_op_never_returns_float32():
    a, b = _operands("mm")

    @torch.compile(fullgraph=True, backend="eager")
    def f(x, y):
        return gemmtune.mm(x, y, backends=("numba",))

    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(Exception, match="bfloat16"):
        f(a, b)


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm"])
def test_tune_under_autocast_tunes_the_cast_problem_and_its_selection_gives_torchs_dtype(op):
    args = _operands(op)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = getattr(torch, op)(*args)
        sel = gemmtune.tune(op, *args)  # default CPU backends: aten, NumPy and numba
        assert sel.problem.dtype == torch.bfloat16  # every candidate was timed in torch's dtype
        assert {t.choice.template_uid for t in sel.timings} == {f"aten_{op}"}  # numba/NumPy have no bf16
        got = sel(*args)
        with pytest.raises(NoCandidatesError, match="bfloat16"):
            gemmtune.tune(op, *args, backends=("numba",))
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("family", ["extern", "numba"])
def test_a_float32_selection_under_autocast_is_refused_not_float32(family):
    a, b = _operands("mm")
    sel = gemmtune.tune("mm", a, b, backends=(family,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(gemmtune.InputError, match="tuned for torch.float32, but under torch.autocast"):
            sel(a, b)
    torch.testing.assert_close(sel(a, b), a @ b)  # outside autocast: the float32 problem it was tuned for
