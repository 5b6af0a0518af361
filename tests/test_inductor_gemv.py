"""The default-mode lowering of a matrix-vector mm as a reduction tuned by coordinate descent
(`inductor.gemv`).  On CPU the window does not open (Inductor's CPU kernels are not Triton), so the
lowering is forced open here to check the numbers it computes; the coordinate-descent marking is
checked on the codegen wrapper directly, and on the GPU in tests/gpu/test_inductor_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import gemmtune
import gemmtune.inductor as gi
from gemmtune.inductor import gemv, window

from helpers import fresh_inductor  # noqa: F401 - the fixture

pytestmark = [pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table"),
              pytest.mark.usefixtures("fresh_inductor")]


def _forced_open(monkeypatch):
    """The window as on a GPU: open for gemmtune's handler whatever the device."""
    monkeypatch.setattr(window, "window_applies", lambda args, is_ours, at=-1: is_ours(
        __import__("torch._inductor.virtualized", fromlist=["V"]).V.choices))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 48, 40), (24, 48, 1)])
def test_a_vector_product_is_lowered_as_a_reduction_and_computes_the_product(monkeypatch, dtype, shape):
    _forced_open(monkeypatch)
    m, k, n = shape
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    with gi.installed(gemv=True) as handler:
        out = torch.compile(lambda x, y: (x @ y) * 2, fullgraph=True)(a, b)
    assert handler.stats["vector_product"] == 1, handler.stats
    assert handler.stats["tuned"] == 0 and handler.stats["miss"] == 0  # no GEMM asked for, none tuned
    ref = (a.double() @ b.double()) * 2
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    assert out.dtype == dtype


def test_gemv_false_keeps_a_vector_product_a_gemm(monkeypatch):
    _forced_open(monkeypatch)
    a, b = torch.randn(1, 32), torch.randn(32, 16)
    with gi.installed(gemv=False) as handler:
        out = torch.compile(lambda x, y: x @ y, fullgraph=True)(a, b)
    torch.testing.assert_close(out, a @ b)
    assert handler.stats["vector_product"] == 0 and handler.stats["hit"] >= 1, handler.stats


def test_by_default_a_vector_product_is_a_reduction_whose_configs_are_timed():
    assert gi.install().gemv == "autotune"
    gi.uninstall()


def test_a_matrix_product_and_a_dynamic_one_stay_gemms(monkeypatch):
    _forced_open(monkeypatch)
    a, b = torch.randn(8, 32), torch.randn(32, 16)
    with gi.installed(gemv=True) as handler:
        torch.testing.assert_close(torch.compile(lambda x, y: x @ y, fullgraph=True)(a, b), a @ b)
        f = torch.compile(lambda x, y: x @ y, dynamic=True, fullgraph=True)
        for m in (1, 3, 5):  # symbolic M: not statically a vector product
            x = torch.randn(m, 32)
            torch.testing.assert_close(f(x, b), x @ b)
    assert handler.stats["vector_product"] == 0, handler.stats


def test_is_vector_product_reads_static_sizes_only():
    assert gemv.is_vector_product((1, 64), (64, 8)) and gemv.is_vector_product((8, 64), (64, 1))
    assert not gemv.is_vector_product((2, 64), (64, 2))
    assert not gemv.is_vector_product(("s0", 64), (64, 8))  # a symbol is not an int


def test_bad_gemv_value_is_a_value_error():
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="gemv"):
            gi.install(gemv=bad)
    assert not gi.installer._PRIOR  # nothing installed


def _entry(meta):
    return SimpleNamespace(node=SimpleNamespace(origins=[SimpleNamespace(meta=meta)]))


def test_only_a_kernel_holding_a_marked_node_is_generated_with_its_tuning():
    from torch._inductor import config

    seen = []
    wrapped = gemv._wrap_codegen(lambda self, features: seen.append(
        (config.coordinate_descent_tuning, config.max_autotune_pointwise)))
    descent, timed = {gemv.MARK: gemv.TUNING[True]}, {gemv.MARK: gemv.TUNING["autotune"]}
    wrapped(None, SimpleNamespace(node_schedule=[_entry({}), _entry(descent)]))
    wrapped(None, SimpleNamespace(node_schedule=[_entry({}), object()]))
    wrapped(None, [_entry(timed)])  # an older signature: the schedule itself
    assert seen == [(True, False), (False, False), (False, True)]
    assert not config.coordinate_descent_tuning and not config.max_autotune_pointwise


@pytest.mark.parametrize("how", [True, "autotune"])
def test_the_lowering_marks_its_node_with_the_tuning_asked_for(monkeypatch, how):
    _forced_open(monkeypatch)
    marks = []
    real = gemv.gemv_lowering

    def spy(a, b, h):
        out = real(a, b, h)
        from torch._inductor.virtualized import V

        marks.append(V.graph.current_node.meta[gemv.MARK])
        return out

    monkeypatch.setattr(gemv, "gemv_lowering", spy)
    a, b = torch.randn(1, 32), torch.randn(32, 16)
    with gi.installed(gemv=how):
        torch.testing.assert_close(torch.compile(lambda x, y: x @ y, fullgraph=True)(a, b), a @ b)
    assert marks == [gemv.TUNING[how]]


def test_hook_codegen_wraps_inductors_codegen_once():
    from torch._inductor.codegen.simd import SIMDScheduling

    assert gemv.hook_codegen()
    fn = SIMDScheduling.codegen_node_schedule
    assert gemv.hook_codegen() and SIMDScheduling.codegen_node_schedule is fn
    assert hasattr(fn, "__gemmtune_gemv__")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_outer_product_is_lowered_as_a_multiply_and_computes_the_product(monkeypatch, dtype):
    _forced_open(monkeypatch)
    a, b = torch.randn(24, 1, dtype=dtype), torch.randn(1, 40, dtype=dtype)
    with gi.installed() as handler:
        out = torch.compile(lambda x, y: (x @ y) * 2, fullgraph=True)(a, b)
    assert handler.stats["outer_product"] == 1, handler.stats
    assert handler.stats["tuned"] == 0 and handler.stats["miss"] == 0  # no GEMM asked for, none tuned
    torch.testing.assert_close(out, (a.float() @ b.float() * 2).to(dtype), rtol=0, atol=0)  # one product each
    assert out.dtype == dtype


def test_an_outer_product_of_a_broadcast_operand_keeps_its_values(monkeypatch):
    _forced_open(monkeypatch)
    a = torch.randn(1, 1).expand(24, 1)  # a stride-0 column, as a backward's expanded gradient
    b = torch.randn(40).unsqueeze(0)
    with gi.installed() as handler:
        out = torch.compile(lambda x, y: x @ y, fullgraph=True)(a, b)
    assert handler.stats["outer_product"] == 1, handler.stats
    torch.testing.assert_close(out, a @ b)


def test_is_outer_product_needs_k_one_and_a_matrix_out():
    assert gemv.is_outer_product((64, 1), (1, 8))
    assert not gemv.is_outer_product((1, 1), (1, 8)) and not gemv.is_outer_product((64, 1), (1, 1))
    assert not gemv.is_outer_product((64, 2), (2, 8)) and not gemv.is_outer_product(("s0", 1), (1, 8))


def test_an_outer_products_node_is_marked_for_timed_configs(monkeypatch):
    _forced_open(monkeypatch)
    marks = []
    real = gemv.outer_lowering

    def spy(a, b):
        out = real(a, b)
        from torch._inductor.virtualized import V

        marks.append(V.graph.current_node.meta[gemv.MARK])
        return out

    monkeypatch.setattr(gemv, "outer_lowering", spy)
    a, b = torch.randn(24, 1), torch.randn(1, 40)
    with gi.installed():
        torch.testing.assert_close(torch.compile(lambda x, y: x @ y, fullgraph=True)(a, b), a @ b)
    assert marks == [gemv.OUTER_TUNING]
