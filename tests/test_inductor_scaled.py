"""`torch._scaled_mm` under `torch.compile` with gemmtune's handler installed (`gemmtune.inductor.scaled`).

CPU Inductor lowers `_scaled_mm` through `tuned_scaled_mm` and asks the choices handler (the library
extern is its only candidate there), so the problem read from a real compile, the tune on a miss, the
warm store, the library stand-in for a Triton pick and the fallbacks are tested for real here; the
Triton entries are built here and compiled in tests/gpu/test_scaled_mm_inductor_gpu.py.
"""

from __future__ import annotations

import logging
import types

import pytest
import torch

import gemmtune.inductor as gi
from gemmtune.core.choices import Choice, Timing, as_params
from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.inductor import scaled
from gemmtune.store.rows import to_row, to_timing
from helpers import fp8_operands, fresh_inductor  # noqa: F401 - the fixture

pytestmark = [pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table"),
              pytest.mark.usefixtures("fresh_inductor")]

BF16 = torch.bfloat16
ATEN = "aten::_scaled_mm"
TILE = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, num_stages=4, num_warps=8)


def fp8_linear(a, b, sa, sb, bias=None, fast=False):
    return torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=BF16, use_fast_accum=fast).relu()


def compiled(tensors, fast=False, **kw):
    """(compiled output, generated code) of `fp8_linear` over `tensors` (a, b, scale_a, scale_b[, bias])."""
    from torch._inductor.utils import run_and_get_code

    f = torch.compile(lambda *t: fp8_linear(*t[:4], t[4] if len(t) > 4 else None, fast), fullgraph=True, **kw)
    out, code = run_and_get_code(f, *tensors)
    return out, "\n".join(code)


def operands(rowwise, bias, M=16, K=64, N=32):
    tensors = fp8_operands(M, K, N, rowwise)
    return tensors + ((torch.randn(N).to(BF16),) if bias else ())


# -- a real compile: the problem, the tune, the store ----------------------------------------------

@pytest.mark.parametrize("rowwise,bias,fast", [(False, False, False), (True, True, False), (False, True, True)],
                         ids=["tensorwise", "rowwise_bias", "tensorwise_bias_fast"])
def test_a_compiled_scaled_mm_is_keyed_as_the_eager_problem_tuned_and_built_as_the_pick(rowwise, bias, fast):
    tensors = operands(rowwise, bias)
    with gi.installed() as handler, gi.benchmark_probe() as probe:
        out, code = compiled(tensors, fast)
    torch.testing.assert_close(out, fp8_linear(*tensors[:4], tensors[4] if bias else None, fast), rtol=0, atol=0)
    eager = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16, fast_accum=fast)
    assert handler.picks[eager.problem_key].inputs == eager  # the compile's problem is the eager one
    assert handler.stats["scaled_mm_tuned"] == 1 and handler.stats["scaled_mm_hit"] == 1
    assert handler.stats["scaled_mm_fallback"] == 0 and probe.choices == 0
    assert handler.built == [("scaled_mm", ATEN, {})]  # CPU: the library kernel is the only candidate
    assert f"extern_kernels._scaled_mm(" in code and f"out_dtype=torch.bfloat16, use_fast_accum={fast}" in code


def test_a_fresh_handler_takes_the_pick_from_the_warm_store():
    tensors = operands(True, False)
    for round_ in range(2):  # cold store, then a new handler (and a new compile) on the warm store
        torch._dynamo.reset()
        with gi.installed() as handler:
            out, _ = compiled(tensors)
        torch.testing.assert_close(out, fp8_linear(*tensors), rtol=0, atol=0)
        assert handler.stats["scaled_mm_tuned"] == 1 and handler.stats["scaled_mm_store_hit"] == round_


def test_without_tune_on_miss_a_new_problem_keeps_inductors_own_list():
    tensors = operands(False, False)
    with gi.installed(tune_on_miss=False) as handler:
        out, _ = compiled(tensors)
    torch.testing.assert_close(out, fp8_linear(*tensors), rtol=0, atol=0)
    assert handler.stats["scaled_mm_miss"] == 1 and handler.stats["scaled_mm_hit"] == 0 and not handler.picks


def test_a_triton_pick_inductor_cannot_build_here_gets_the_library_kernel():
    """CPU Inductor offers no Triton template for `_scaled_mm`: the handler stands the library kernel in."""
    tensors = operands(True, True)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16)
    entry = {"template_id": "triton::mm", **TILE, "GROUP_M": 8}
    with gi.installed(tune_on_miss=False) as handler:
        handler.add(gi.InductorPick("scaled_mm", (ki.problem_key,), (entry,), True, "triton_scaled_mm", inputs=ki))
        out, _ = compiled(tensors)
    torch.testing.assert_close(out, fp8_linear(*tensors[:4], tensors[4]), rtol=0, atol=0)
    assert handler.stats["scaled_mm_library_stand_in"] == 1 and handler.stats["scaled_mm_hit"] == 1
    assert handler.built == [("scaled_mm", ATEN, {})]


# -- what gemmtune does not take: Inductor's own lowering, never an error ---------------------------

def _odd_k():
    a, w = torch.randn(16, 40).to(torch.float8_e4m3fn), torch.randn(32, 40).to(torch.float8_e4m3fn)
    return (a, w.t(), torch.tensor(1.0), torch.tensor(1.0)), {}


@pytest.mark.parametrize("case,needle", [("odd_k", "must be multiples of 16"), ("dynamic", "dynamic shapes"),
                                         ("fp8_out", "float8 outputs")])
def test_calls_gemmtune_does_not_take_fall_back_to_inductor_with_a_log_line(case, needle, caplog):
    tensors, kw = _odd_k() if case == "odd_k" else (operands(False, False), {})
    if case == "dynamic":
        kw = {"dynamic": True}
    fn = (lambda *t: torch._scaled_mm(*t)) if case == "fp8_out" else (lambda *t: fp8_linear(*t))
    with caplog.at_level(logging.INFO, logger="gemmtune"), gi.installed() as handler:
        out = torch.compile(fn, fullgraph=True, **kw)(*tensors)
    torch.testing.assert_close(out.float(), fn(*tensors).float(), rtol=0, atol=0)
    assert handler.stats["scaled_mm_fallback"] == 1 and handler.stats["scaled_mm_tuned"] == 0
    assert any("left to Inductor" in r.message and needle in r.message for r in caplog.records)


# -- the problem from Inductor-like inputs ---------------------------------------------------------

def _kernel_inputs(tensors, out_dtype=BF16):
    """Inductor's MMKernelInputs of `tuned_scaled_mm` for these tensors (the nodes keys.py builds)."""
    from torch._inductor.kernel_inputs import MMKernelInputs

    from gemmtune.inductor.keys import _node

    nodes = [_node(i, TensorMeta.of(t)) for i, t in enumerate(tensors)]
    return MMKernelInputs(nodes, mat1_idx=0, mat2_idx=1, out_dtype=out_dtype)


def _sizes():
    from torch._inductor.virtualized import V

    from gemmtune.inductor.keys import _Sizes

    return V.set_graph_handler(_Sizes())


def test_the_problem_of_inductor_like_inputs_and_its_options():
    tensors = operands(True, True)
    fast_only = {"triton::mm": {"USE_FAST_ACCUM": True}}  # the ATEN backend off: the options of the Triton call
    with _sizes():
        ki = scaled.scaled_problem(_kernel_inputs(tensors), {ATEN: {"out_dtype": BF16, "use_fast_accum": False}})
        fast = scaled.scaled_problem(_kernel_inputs(tensors), fast_only)
        unknown = scaled.scaled_problem(_kernel_inputs(tensors), {})
    assert ki == KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16)
    assert fast == KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16, fast_accum=True)
    assert "use_fast_accum" in unknown


@pytest.mark.parametrize("change,needle", [
    ("e5m2_both", "both float8_e5m2"), ("row_major_b", "column-major"), ("float32_bias", "bias must be"),
    ("scale_result", "scale_result"), ("v2", "_scaled_mm_v2"), ("empty", "empty problem")])
def test_inductor_like_inputs_gemmtune_refuses_say_why(change, needle):
    a, b, sa, sb, bias = operands(True, True, M=0 if change == "empty" else 16)
    if change == "e5m2_both":
        a, b = a.to(torch.float8_e5m2), b.t().contiguous().to(torch.float8_e5m2).t()
    if change == "row_major_b":
        b = b.contiguous()
    if change == "float32_bias":
        bias = bias.float()
    target = torch.ops.aten._scaled_mm_v2.default if change == "v2" else torch.ops.aten._scaled_mm.default
    node = types.SimpleNamespace(target=target, args=(a, b, sa, sb, bias, sa if change == "scale_result" else None),
                                 kwargs={})
    with _sizes():
        why = scaled.scaled_problem(_kernel_inputs((a, b, sa, sb, bias)), {ATEN: {"out_dtype": BF16,
                                                                               "use_fast_accum": False}}, node)
    assert isinstance(why, str) and needle in why


# -- the decision: library kernel or Inductor's Triton template --------------------------------------

def cuda_problem(rowwise=True, K=4096, fast=False):
    meta = lambda size, stride, dt=torch.float8_e4m3fn: TensorMeta(size, stride, dt, "cuda:0")  # noqa: E731
    M, N = 128, 256
    scales = ((meta((M, 1), (1, 1), torch.float32), meta((1, N), (N, 1), torch.float32)) if rowwise else
              (meta((), (), torch.float32),) * 2)
    return KernelInputs("scaled_mm", (meta((M, K), (K, 1)), meta((K, N), (1, K)), *scales), out_dtype=BF16,
                        fast_accum=fast)


def from_store_row(uid, config=None, runtime=None, ms=0.1):
    """A Timing as the store gives it back (through its row)."""
    choice = Choice(uid, None if uid == scaled.LIBRARY else "h", as_params(config or {}), as_params(runtime or {}))
    return to_timing(to_row(Timing(choice, ms, "store")))


def test_store_rows_decide_the_library_extern_or_inductors_mm_template_with_the_same_config():
    from torch._inductor.kernel.mm import mm_template

    handler = gi.install(tune_on_miss=False)
    offered = {ATEN: None, mm_template.uid: mm_template.src_hash}
    lib = scaled.scaled_entries(cuda_problem(), from_store_row(scaled.LIBRARY).choice)
    assert lib.exact and scaled.plan(handler, lib, offered) == [(ATEN, {})]
    row = from_store_row(scaled.TRITON, TILE, {"swizzle": 4})
    tri = scaled.scaled_entries(cuda_problem(K=4000, fast=True), row.choice, [row])
    assert tri.exact and tri.keys == (cuda_problem(K=4000, fast=True).problem_key,) and tri.ms == 0.1
    assert scaled.plan(handler, tri, offered) == [(mm_template.uid, {
        **TILE, "GROUP_M": 4, "EVEN_K": False, "ACC_TYPE": "tl.float32", "USE_FAST_ACCUM": True})]
    assert scaled.plan(handler, tri, {ATEN: None}) == []  # not offered here: the library kernel stands in
    on_cpu = scaled.scaled_entries(KernelInputs.from_tensors("scaled_mm", *operands(True, False)), row.choice, [row])
    assert not on_cpu.exact and on_cpu.entries == ({"template_id": ATEN},)  # no Triton for a CPU problem


def test_a_pick_without_an_inductor_counterpart_offers_the_best_triton_configs_and_the_library():
    timings = [from_store_row(scaled.TRITON, dict(TILE, BLOCK_M=m), {"swizzle": 8}, ms)
               for m, ms in ((16, 0.3), (32, 0.1), (128, 0.2))]
    pick = scaled.scaled_entries(cuda_problem(), Choice("cutlass_fp8", "h"), timings)
    assert not pick.exact
    assert [(e["template_id"], e.get("BLOCK_M")) for e in pick.entries] == [("triton::mm", 32), ("triton::mm", 128),
                                                                           (ATEN, None)]


def test_a_stale_triton_entry_is_dropped_with_a_warning():
    from torch._inductor.kernel.mm import mm_template

    handler = gi.install(tune_on_miss=False)
    pick = scaled.scaled_entries(cuda_problem(), Choice(scaled.TRITON, "h", as_params(TILE)))
    with pytest.warns(RuntimeWarning, match="entry dropped"):
        assert scaled.plan(handler, pick, {ATEN: None, mm_template.uid: "another source"}) == []
    assert handler.stats["stale"] == 1


# -- install and uninstall -------------------------------------------------------------------------

def test_install_leaves_inductors_lowering_in_place_and_uninstall_stops_the_answers():
    from torch._inductor.lowering import lowerings

    op = torch.ops.aten._scaled_mm.default
    before = lowerings[op]
    handler = gi.install()
    assert lowerings[op] is before and scaled.note_lowering()
    gi.uninstall()
    tensors = operands(False, False)
    out, _ = compiled(tensors)
    torch.testing.assert_close(out, fp8_linear(*tensors), rtol=0, atol=0)
    assert lowerings[op] is before and not handler.stats and not handler.picks


def test_a_torch_without_tuned_scaled_mm_is_one_log_line_and_mm_is_still_served(monkeypatch, caplog):
    from torch._inductor.kernel import mm

    monkeypatch.delattr(mm, "tuned_scaled_mm")
    with caplog.at_level(logging.INFO, logger="gemmtune"):
        handler = gi.install()
    assert [r.message for r in caplog.records if "tuned_scaled_mm" in r.message] == [
        f"gemmtune.inductor: torch {torch.__version__} has no tuned_scaled_mm in torch._inductor.kernel.mm: "
        "torch.compile's _scaled_mm calls are left to Inductor"]
    x, y = torch.randn(16, 8), torch.randn(8, 4)
    torch.testing.assert_close(torch.compile(torch.mm, fullgraph=True)(x, y), x @ y)
    assert handler.stats["tuned"] == 1
