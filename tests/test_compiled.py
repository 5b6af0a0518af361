"""gemmtune inside torch.compile: decided at trace time (static shapes), emitted as the pick itself;
dynamic shapes and untraceable picks keep the opaque runtime op; gradients go the same way."""

from __future__ import annotations

import pytest
import torch

import gemmtune
from gemmtune import engine
from gemmtune.core.settings import Settings
from gemmtune.dispatch import compiled
from gemmtune.store.sqlite import Store
from gemmtune.templates import default_templates
from torch._dynamo.backends.common import aot_autograd

EXTERN = ("extern",)


def _spy():
    """A backend that records the ATen-level graph (after the traced ops were decomposed)."""
    seen: list[str] = []

    def fw(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    return aot_autograd(fw_compiler=fw, bw_compiler=fw), seen


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("GEMMTUNE_STORE", "memory")
    gemmtune.clear_dispatch_cache()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_static_shapes_emit_the_library_pick_as_the_aten_op(monkeypatch):
    calls = []
    real_tune = engine.tune
    monkeypatch.setattr(engine, "tune", lambda *a, **k: calls.append(k.get("store_tag")) or real_tune(*a, **k))
    backend, seen = _spy()
    f = torch.compile(lambda x, w: torch.relu(gemmtune.mm(x, w, backends=EXTERN)), backend=backend, fullgraph=True)
    x, w = torch.randn(8, 6), torch.randn(6, 5)
    for _ in range(3):
        torch.testing.assert_close(f(x, w), torch.relu(x @ w))
    assert "aten.mm.default" in seen and not any("gemmtune" in s for s in seen)
    assert calls == ["traced"]  # tuned once, at trace time, under its own store key


def test_addmm_bmm_and_col_layout_emitted(monkeypatch):
    backend, seen = _spy()

    def f(bias, x, w, p, q):
        y = gemmtune.addmm(bias, x, w, beta=0.5, alpha=2.0, backends=EXTERN)
        return y, gemmtune.bmm(p, q, backends=EXTERN, out_layout="col")

    g = torch.compile(f, backend=backend, fullgraph=True)
    args = torch.randn(5), torch.randn(4, 3), torch.randn(3, 5), torch.randn(2, 4, 3), torch.randn(2, 3, 6)
    y, z = g(*args)
    torch.testing.assert_close(y, torch.addmm(args[0], args[1], args[2], beta=0.5, alpha=2.0))
    torch.testing.assert_close(z, torch.bmm(args[3], args[4]))
    assert z.stride() == (24, 1, 4)
    assert not any("gemmtune" in s for s in seen)


def test_dynamic_shapes_keep_the_opaque_op():
    backend, seen = _spy()
    f = torch.compile(lambda x, w: gemmtune.mm(x, w, backends=EXTERN), backend=backend, dynamic=True, fullgraph=True)
    w = torch.randn(6, 5)
    for m in (7, 9):
        x = torch.randn(m, 6)
        torch.testing.assert_close(f(x, w), x @ w)
    assert "gemmtune.mm.default" in seen


def test_a_problem_no_traceable_template_runs_keeps_the_opaque_op(monkeypatch):
    # e.g. backends=("numba",): nothing to emit, so the trace calls the runtime op, which tunes on first call
    backend, seen = _spy()
    monkeypatch.setattr(compiled, "_tune_traced", lambda *a: None)
    f = torch.compile(lambda x, w: gemmtune.mm(x, w, backends=EXTERN), backend=backend, fullgraph=True)
    x, w = torch.randn(4, 3), torch.randn(3, 2)
    torch.testing.assert_close(f(x, w), x @ w)
    assert "gemmtune.mm.default" in seen


def test_no_traceable_template_for_the_backends_gives_none():
    assert compiled._tune_traced("mm", (torch.randn(4, 3), torch.randn(3, 2)), 1.0, 1.0, ("numba",), None) is None


def test_gradients_are_traced_gemms_too():
    backend, seen = _spy()
    f = torch.compile(lambda x, w: gemmtune.mm(x, w, backends=EXTERN).sum(), backend=backend, fullgraph=True)
    x, w = torch.randn(8, 6, requires_grad=True), torch.randn(6, 5, requires_grad=True)
    f(x, w).backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (x2 @ w2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
    assert seen.count("aten.mm.default") == 3 and not any("gemmtune" in s for s in seen)


def test_traced_and_eager_picks_are_stored_apart(tmp_path):
    store = Store(str(tmp_path / "s.db"))
    a, b = torch.randn(16, 8), torch.randn(8, 4)
    engine.tune("mm", a, b, backends=EXTERN, store=store)
    engine.tune("mm", a, b, backends=EXTERN, store=store, store_tag="traced")
    problems = {row[0] for row in store._db.execute("SELECT problem FROM picks")}
    assert len(problems) == 2 and any(p.endswith("|traced") for p in problems)


def test_traceable_templates():
    traceable = sorted(t.uid for t in default_templates() if t.traceable)
    assert traceable == ["aten_addmm", "aten_bias_addmm", "aten_bmm", "aten_mm", "triton_gemv", "triton_mm"]


def test_inductor_code_calls_no_gemmtune_op():
    from torch._inductor.utils import run_and_get_code

    f = torch.compile(lambda x, w: torch.relu(gemmtune.mm(x, w, backends=EXTERN)), fullgraph=True)
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    out, code = run_and_get_code(f, x, w)
    torch.testing.assert_close(out, torch.relu(x @ w))
    assert "torch.ops.gemmtune" not in "\n".join(code)


def test_settings_reach_the_traced_pool(monkeypatch):
    monkeypatch.setenv("GEMMTUNE_HOPPER_TEMPLATES", "0")
    assert Settings.from_env().hopper_templates is False
    pool = [t.uid for t in default_templates(False) if t.traceable]
    assert "triton_gemv" not in pool and "triton_mm" in pool
