"""A pick Inductor cannot build, handed over as gemmtune's own kernel (`gemmtune.inductor.extern`).

On CPU the numba template stands in for the CUTLASS ones (which need a Hopper GPU): with
`install(templates="all", extern=("numba_mm",))` its pick is one extern choice, the compiled graph
calls gemmtune's numba kernel into Inductor's buffer, and a process that did not tune the problem
tunes it once from the store.  The CUTLASS case runs in tests/gpu/test_inductor_extern_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

import gemmtune
import gemmtune.inductor as gi
from gemmtune.core.inputs import TensorMeta
from gemmtune.inductor import extern
from helpers import fresh_inductor  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table")

NUMBA = gemmtune.Settings(store="memory", backends=("numba",))


@pytest.fixture(autouse=True)
def _fresh(fresh_inductor):
    extern._KERNELS.clear()
    extern.STATS.clear()
    yield


def _compiled_code(fn, *args):
    from torch._inductor.utils import run_and_get_code

    out, codes = run_and_get_code(torch.compile(fn, mode="max-autotune-no-cudagraphs", fullgraph=True), *args)
    return out, "\n".join(codes)


def test_a_numba_pick_runs_as_gemmtunes_kernel_inside_the_compiled_graph(monkeypatch):
    a, b = torch.randn(48, 40), torch.randn(40, 24)
    handler = gi.install(settings=NUMBA, templates="all", extern=("numba_mm",), fusion=0)
    out, code = _compiled_code(lambda x, y: (x @ y) * 2, a, b)
    torch.testing.assert_close(out, (a @ b) * 2, rtol=1e-4, atol=1e-4)
    assert "extern_kernels.gemmtune_pick" in code and "numba_mm" in code
    assert handler.stats["tuned"] == 1 and handler.built[0][1] == extern.EXTERN_UID
    assert extern.STATS["registered"] == 1 and extern.STATS["calls"] >= 1 and extern.STATS["retuned"] == 0


def test_without_extern_the_same_pick_is_handed_over_as_inductors_closest_kernel():
    a, b = torch.randn(48, 40), torch.randn(40, 24)
    handler = gi.install(settings=NUMBA, templates="all", extern=(), fusion=0)
    out, code = _compiled_code(lambda x, y: (x @ y) * 2, a, b)
    torch.testing.assert_close(out, (a @ b) * 2, rtol=1e-4, atol=1e-4)
    assert "gemmtune_pick" not in code
    assert handler.built and handler.built[0][1] != extern.EXTERN_UID
    assert extern.STATS["calls"] == 0


def test_an_addmm_pick_keeps_alpha_and_beta_through_the_extern_call():
    bias, a, b = torch.randn(24), torch.randn(32, 40), torch.randn(40, 24)
    gi.install(settings=NUMBA, templates="all", extern=("numba_mm",), fusion=0)
    out, code = _compiled_code(lambda z, x, y: torch.addmm(z, x, y, beta=0.5, alpha=2.0), bias, a, b)
    torch.testing.assert_close(out, torch.addmm(bias, a, b, beta=0.5, alpha=2.0), rtol=1e-4, atol=1e-4)
    assert "extern_kernels.gemmtune_pick" in code and "addmm;2.0;0.5;" in code


def test_a_process_without_the_kernel_tunes_the_problem_once_from_the_store():
    a, b = torch.randn(48, 40), torch.randn(40, 24)
    gi.install(settings=NUMBA, templates="all", extern=("numba_mm",), fusion=0)
    f = torch.compile(lambda x, y: x @ y, mode="max-autotune-no-cudagraphs", fullgraph=True)
    f(a, b)
    extern._KERNELS.clear()  # as a process that loaded this graph from Inductor's cache would be
    for _ in range(3):
        torch.testing.assert_close(f(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert extern.STATS["retuned"] == 1 and extern.STATS["retuned_from_store"] == 1  # the store answered
    assert extern.STATS["differs"] == 0


def test_run_pick_writes_a_non_contiguous_out_through_a_fresh_result():
    a, b = torch.randn(6, 5), torch.randn(5, 4)
    pick = extern.pick_text("mm", 1.0, 1.0, "stand_in")
    from gemmtune.core.inputs import TensorMeta

    extern.register(pick, (TensorMeta.of(a), TensorMeta.of(b)), lambda x, y, out=None: torch.mm(x, y, out=out))
    out = torch.empty(4, 6).t()  # column-major
    assert extern.run_pick(a, b, pick=pick, out=out) is out
    torch.testing.assert_close(out, a @ b)


@pytest.mark.parametrize("text", ["mm;1.0;0.0", "mm;one;0.0;k", ""])
def test_a_malformed_pick_is_a_value_error_naming_it(text):
    with pytest.raises(ValueError, match="not a pick"):
        extern.parse_pick(text)


@pytest.mark.parametrize("bad", ["numba_mm", [1, 2]])
def test_install_refuses_an_extern_that_is_not_a_list_of_names(bad):
    with pytest.raises(ValueError, match="extern"):
        gi.install(extern=bad)


def test_a_graph_from_inductors_cache_calls_the_kernel_in_a_process_that_never_lowered_it(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters
    from torch._inductor import config
    from torch._inductor.select_algorithm import extern_kernels

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    a, b = torch.randn(48, 40), torch.randn(40, 24)
    gi.install(settings=NUMBA, templates="all", extern=("numba_mm",), fusion=0)
    assert hasattr(extern_kernels, extern.EXTERN_NAME)  # made at install, before any graph asks for it
    with config.patch(fx_graph_cache=True):
        torch.compile(lambda x, y: x @ y, mode="max-autotune-no-cudagraphs", fullgraph=True)(a, b)
        torch._dynamo.reset()
        extern._KERNELS.clear()  # what a new process holds
        counters["inductor"].clear()
        out = torch.compile(lambda x, y: x @ y, mode="max-autotune-no-cudagraphs", fullgraph=True)(a, b)
    assert counters["inductor"]["fxgraph_cache_hit"] == 1
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)
    assert extern.STATS["retuned"] == 1 and extern.STATS["retuned_from_store"] == 1


def test_the_extern_choice_is_made_once_and_again_after_a_reload():
    import importlib

    from torch._inductor.select_algorithm import extern_kernels

    first = extern.extern_choice()
    assert extern.extern_choice() is first and first.name == extern.EXTERN_NAME
    importlib.reload(extern)  # the module's own record of it is gone; Inductor's name is still taken
    again = extern.extern_choice()  # no "duplicate extern kernel" assertion
    assert again.name == extern.EXTERN_NAME and callable(getattr(extern_kernels, extern.EXTERN_NAME))
    assert extern.extern_choice() is again


def test_a_registered_kernel_is_bound_to_its_problem_on_its_first_call():
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    metas = [TensorMeta.of(t) for t in (a, b)]
    calls = []

    def kernel(*tensors, out=None):
        calls.append("launcher")
        return torch.mm(*tensors, out=out)

    kernel.bound = lambda *tensors: calls.append("bind") or (lambda *t, out=None: torch.mm(*t, out=out))
    extern.register("pick", metas, kernel)
    for _ in range(2):
        out = torch.empty(8, 6)
        torch.testing.assert_close(extern.run_pick(a, b, pick="pick", out=out), a @ b)
    assert calls == ["bind"]  # bound once, the launcher itself never run
