"""A Selection and the fp8 dispatch run their kernel bound to the problem (`core.binding`), as the tuner
timed it: the binding is made on the first call, with its operands, and used on every later call."""

from __future__ import annotations

import types

import pytest
import torch

import gemmtune
from gemmtune.core.binding import first_call_binding
from gemmtune.dispatch import fp8


@pytest.fixture(autouse=True)
def _empty_dispatch():
    yield
    gemmtune.clear_dispatch_cache()  # the stand-in Selection the fp8 test keeps


def test_a_selection_binds_its_kernel_on_its_first_call():
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    sel = gemmtune.tune("mm", a, b, backends=("extern",), settings=gemmtune.Settings(store="off"), progress=False)
    binds = []
    bind = sel.kernel.bound
    sel.kernel.bound = lambda *t: binds.append(len(t)) or bind(*t)
    a2 = torch.randn(8, 4)
    torch.testing.assert_close(sel(a, b), a @ b)
    torch.testing.assert_close(sel(a2, b), a2 @ b)
    assert binds == [2]


def test_the_fp8_dispatch_runs_a_generated_pick_bound_to_its_problem(monkeypatch):
    calls = []

    def kernel(*tensors, out=None):
        calls.append("launcher")
        return tensors[0]

    kernel.bound = lambda *tensors: calls.append("bind") or (lambda *t, out=None: calls.append("bound") or t[0])
    sel = types.SimpleNamespace(kernel=kernel, winner=types.SimpleNamespace(template_uid="triton_scaled_mm"))
    monkeypatch.setattr("gemmtune.engine.tune", lambda *args, **kw: sel)
    tensors = (torch.ones(2, 2), torch.ones(2, 2), torch.ones(()), torch.ones(()))
    run = fp8._build(tensors, torch.bfloat16, False, None, ("key",))
    run(*tensors)
    run(*tensors)
    assert calls == ["bind", "bound", "bound"]
    assert first_call_binding(len) is len  # a kernel with nothing to bind runs as it is
