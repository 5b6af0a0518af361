"""A patched `nn.Linear` remembers its decided problem: library winners run `F.linear`, others their kernel."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.dispatch import eager, patching


pytestmark = pytest.mark.usefixtures("memory_store")


def _pair(bias: bool, seed: int = 0) -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(seed)
    plain = nn.Linear(12, 8, bias=bias)
    patched = nn.Linear(12, 8, bias=bias)
    patched.load_state_dict(plain.state_dict())
    return plain, patched


def _api_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    for name in ("mm", "addmm"):
        real = getattr(eager, name)
        monkeypatch.setattr(eager, name, lambda *a, _n=name, _r=real, **k: (calls.append(_n), _r(*a, **k))[1])
    return calls


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(12,), (5, 12), (2, 3, 12)])
def test_library_winner_runs_f_linear_after_the_first_call(monkeypatch, bias, shape):
    plain, patched = _pair(bias)
    gemmtune.patch(patched, backends=("extern",))
    calls = _api_calls(monkeypatch)
    x = torch.randn(*shape)
    first = patched(x)
    assert len(calls) == 1  # the first call tunes through gemmtune
    assert patching._LINEAR and all(fn is torch.nn.functional.linear for fn in patching._LINEAR.values())
    second = patched(x)
    assert len(calls) == 1  # the second goes straight to F.linear
    torch.testing.assert_close(first, plain(x))
    torch.testing.assert_close(second, plain(x))
    assert second.shape == plain(x).shape


@pytest.mark.parametrize("bias", [False, True])
def test_generated_winner_runs_its_kernel_with_gradients(monkeypatch, bias):
    plain, patched = _pair(bias, seed=1)
    gemmtune.patch(patched, backends=("numba",))
    calls = _api_calls(monkeypatch)
    x = torch.randn(2, 4, 12)
    patched(x)
    fns = list(patching._LINEAR.values())
    assert len(fns) == 1 and fns[0] is not torch.nn.functional.linear
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = patched(x1)
    assert len(calls) == 1  # served by the remembered kernel
    ref = plain(x2)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    out.square().sum().backward()
    ref.square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(patched.weight.grad, plain.weight.grad, rtol=1e-4, atol=1e-4)


def test_a_new_stride_of_a_library_shape_runs_f_linear_and_a_new_backend_is_a_new_problem(monkeypatch):
    plain, patched = _pair(False)
    gemmtune.patch(patched, backends=("extern",))
    calls = _api_calls(monkeypatch)
    x = torch.randn(6, 12)
    patched(x)
    col = x.t().contiguous().t()  # same shape, column-major: F.linear serves any strides
    torch.testing.assert_close(patched(col), plain(col))
    assert len(calls) == 1
    gemmtune.patch(patched, backends=("numba",))
    patched(x)
    assert len(calls) == 2


def test_a_dtype_or_device_move_forgets_the_decided_shapes(monkeypatch):
    plain, patched = _pair(True)
    gemmtune.patch(patched, backends=("extern",))
    calls = _api_calls(monkeypatch)
    x = torch.randn(3, 12)
    patched(x)
    patched.double()
    plain.double()
    torch.testing.assert_close(patched(x.double()), plain(x.double()))
    assert len(calls) == 2  # the float64 problem was tuned, not served as the float32 one


def test_a_deep_copy_runs_its_own_weights():
    import copy

    plain, patched = _pair(True, seed=4)
    gemmtune.patch(patched, backends=("extern",))
    x = torch.randn(5, 12)
    patched(x)
    twin = copy.deepcopy(patched)
    with torch.no_grad():
        twin.weight.mul_(3)
    torch.testing.assert_close(twin(x), torch.nn.functional.linear(x, plain.weight * 3, plain.bias))
    torch.testing.assert_close(patched(x), plain(x))
    assert patching.patched_modules(twin) == [""]


def test_warmup_recording_remembers_nothing_and_clear_forgets():
    _, patched = _pair(True)
    x = torch.randn(3, 12)
    gemmtune.warmup(patched, x, backends=("extern",), progress=False, release=False)
    assert not patching._LINEAR  # the recording forward ran torch, with no decision to remember
    patched(x)
    assert len(patching._LINEAR) == 1
    gemmtune.clear_dispatch_cache()
    assert not patching._LINEAR


def test_warmup_records_a_problem_the_fast_path_already_knows():
    """A warm-up's recording forward goes through gemmtune.mm even where the layer has its fast path."""
    _, patched = _pair(False)
    x = torch.randn(5, 12)
    gemmtune.patch(patched, backends=("extern",))
    patched(x)
    assert len(patching._LINEAR) == 1
    report = gemmtune.warmup(patched, x, backends=("extern",), progress=False)
    assert len(report.rows) == 1 and report.rows[0].calls == 1


def test_autocast_takes_the_casting_path():
    plain, patched = _pair(True)
    gemmtune.patch(patched, backends=("extern",))
    x = torch.randn(4, 12)
    patched(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = patched(x), plain(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)


def test_a_weight_kept_outside_the_parameter_dict_is_read_as_the_layer_reads_it():
    """A parametrised weight (a property, not in `_parameters`) takes the general path, correctly."""
    from torch.nn.utils import parametrize

    class Doubled(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    plain, patched = _pair(False, seed=2)
    parametrize.register_parametrization(plain, "weight", Doubled())
    parametrize.register_parametrization(patched, "weight", Doubled())
    gemmtune.patch(patched, backends=("extern",))
    x = torch.randn(5, 12)
    for _ in range(3):  # the first call tunes, the later ones must not reuse a stale weight
        torch.testing.assert_close(patched(x), plain(x))
    with torch.no_grad():
        patched.parametrizations.weight.original.mul_(-1)
        plain.parametrizations.weight.original.mul_(-1)
    torch.testing.assert_close(patched(x), plain(x))


def test_a_decided_library_input_skips_the_weight_signature(monkeypatch):
    """Once a layer's input signature is decided for F.linear, its warm call runs F.linear at once."""
    plain, patched = _pair(True, seed=3)
    gemmtune.patch(patched, backends=("extern",))
    x = torch.randn(4, 12)
    patched(x)
    monkeypatch.setattr(patching, "_signature", lambda *a: pytest.fail("the full signature was built"))
    torch.testing.assert_close(patched(x), plain(x))


def test_a_decided_size_serves_every_input_shape_of_that_problem(monkeypatch):
    """The warm check keys on the input's element count: [6, 12] and [2, 3, 12] are one 6 x 12 problem,
    so the second runs F.linear at once; a new size is a new problem and is tuned; a last dimension
    that is not in_features raises as nn.Linear raises."""
    plain, patched = _pair(True, seed=5)
    gemmtune.patch(patched, backends=("extern",))
    calls = _api_calls(monkeypatch)
    patched(torch.randn(6, 12))
    assert calls == ["addmm"]
    with monkeypatch.context() as m:
        m.setattr(patching, "_signature", lambda *a: pytest.fail("the full signature was built"))
        x3 = torch.randn(2, 3, 12)
        torch.testing.assert_close(patched(x3), plain(x3))
    assert calls == ["addmm"]
    x7 = torch.randn(7, 12)
    torch.testing.assert_close(patched(x7), plain(x7))
    assert calls == ["addmm", "addmm"]  # 7 x 12 is another problem: tuned on its first call
    wrong = torch.randn(9, 8)  # 72 elements, as 6 x 12, but K = 8
    with pytest.raises(RuntimeError):
        plain(wrong)
    with pytest.raises(RuntimeError):
        patched(wrong)


@pytest.mark.parametrize("strict", [False, True])
def test_export_of_a_decided_layer_records_the_general_path(strict):
    """A decided size must not leak the eager warm path into a trace: strict (Dynamo) and non-strict
    export both record what the general path emits, whether or not the layer ran eagerly first."""
    plain, patched = _pair(True, seed=6)
    gemmtune.patch(patched, backends=("extern",))
    x = torch.randn(5, 12)
    fresh = torch.export.export(patched, (x,), strict=strict)
    patched(x), patched(x)  # now decided: the eager warm path serves this size
    decided = torch.export.export(patched, (x,), strict=strict)
    targets = lambda ep: [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]  # noqa: E731
    assert targets(decided) == targets(fresh)
    assert "aten.linear.default" not in targets(decided)
    torch.testing.assert_close(decided.module()(x), plain(x))
