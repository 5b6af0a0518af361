"""One integration for every torch.compile mode (gemmtune.inductor): the default-mode GEMM window,
the predicted epilogue fusion, picks timed on Inductor's kernels kept in the store, and traced
gemmtune GEMMs that meet the same handler.  CPU Inductor builds aten kernels only; the Triton side
runs in tests/gpu/test_inductor_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import gemmtune
import gemmtune.inductor as gi
from gemmtune import engine
from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.inductor import handler as handler_mod
from gemmtune.inductor import timed, window
from gemmtune.inductor.entries import InductorPick, fuse_gain_ms
from gemmtune.store.sqlite import Store
from gemmtune.store import locations

from helpers import fresh_inductor  # noqa: F401 - the fixture

pytestmark = [pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table"),
              pytest.mark.usefixtures("fresh_inductor")]


class _Arg:
    def __init__(self, device):
        self.device = torch.device(device)

    def get_device(self):
        return self.device


def test_the_window_opens_for_gemmtunes_handler_on_a_gpu_gemm_only():
    from torch._inductor import config

    seen = []
    lowering = window._wrap(lambda *a: seen.append((config.max_autotune_gemm, config.benchmark_epilogue_fusion,
                                                     window.in_window())), lambda h: True)
    lowering(_Arg("cpu"), _Arg("cuda"))
    lowering(_Arg("cpu"), _Arg("cpu"))
    window._wrap(lambda *a: seen.append(window.in_window()), lambda h: False)(_Arg("cuda"), _Arg("cuda"))
    assert seen == [(True, False, True), (False, config.benchmark_epilogue_fusion, False), False]
    assert not config.max_autotune_gemm and not window.in_window()  # restored after the lowering


def test_a_scaled_mm_lowering_opens_the_window_by_its_b_matrix():
    """_scaled_mm's arguments end in scales and options, not in B: the window finds the GPU by mat_b,
    so a default-mode compile offers Inductor's fp8 templates and a Triton pick can be built."""
    from torch._inductor import config

    seen = []
    lowering = window._wrap(lambda *a, **k: seen.append((config.max_autotune_gemm, window.in_window())),
                            lambda h: True, torch.ops.aten._scaled_mm.default)
    lowering(_Arg("cuda"), _Arg("cuda"), _Arg("cuda"), _Arg("cuda"), None, None, torch.bfloat16)
    lowering(_Arg("cpu"), _Arg("cpu"), _Arg("cpu"), _Arg("cpu"), None, None, torch.bfloat16)
    assert seen == [(True, True), (False, False)]


def test_open_window_wraps_the_gemm_lowerings_once():
    from torch._inductor import lowering

    assert gi.installer.open_window(handler_mod.is_gemmtune_handler) == 4
    assert hasattr(lowering.lowerings[torch.ops.aten._scaled_mm.default], "__gemmtune_window__")
    fn = lowering.lowerings[torch.ops.aten.mm.default]
    gi.installer.open_window(handler_mod.is_gemmtune_handler)
    assert lowering.lowerings[torch.ops.aten.mm.default] is fn and hasattr(fn, "__gemmtune_window__")


def _gemm_node(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    g = make_fx(fn)(*args).graph
    return next(n for n in g.nodes if n.op == "call_function" and n.target == torch.ops.aten.mm.default)


def test_an_epilogue_is_a_pointwise_user_of_the_gemms_size():
    x, w, r = torch.randn(8, 4), torch.randn(4, 6), torch.randn(8, 6)
    assert window.has_epilogue(_gemm_node(lambda x, w, r: (x @ w) + r, x, w, r))
    assert window.has_epilogue(_gemm_node(lambda x, w, r: torch.relu((x @ w).view(2, 4, 6)), x, w, r))
    assert not window.has_epilogue(_gemm_node(lambda x, w, r: (x @ w).split(3, dim=1)[0].relu(), x, w, r))
    assert not window.has_epilogue(_gemm_node(lambda x, w, r: (x @ w).sum(0), x, w, r))
    assert not window.has_epilogue(_gemm_node(lambda x, w, r: x @ w, x, w, r))


def _library_pick(companion_ms, m=16, op="mm"):
    meta = lambda size, stride: TensorMeta(size, stride, torch.bfloat16, "cuda:0")  # noqa: E731
    operands = (meta((m, 4096), (4096, 1)), meta((4096, 4096), (1, 4096)))
    if op == "addmm":
        operands = (meta((4096,), (1,)), *operands)
    ki = KernelInputs(op, operands)
    companion = {"template_id": "triton::mm", "BLOCK_M": 16}
    lib = {"template_id": f"aten::{op}"}
    return InductorPick(op, ("k",), (lib,), True, f"aten_{op}", ms=0.010, inputs=ki, companions=(companion,),
                        companion_ms=(companion_ms,)), lib, companion


class _T:
    def __init__(self, uid):
        self.uid, self.src_hash = uid, None


def test_fusion_is_predicted_from_the_epilogue_and_the_companions_time(monkeypatch):
    handler = gi.install(tune_on_miss=False)
    near, lib, companion = _library_pick(0.012)
    offered = [_T("aten::mm"), _T("triton::mm")]
    monkeypatch.setattr(handler_mod, "has_epilogue", lambda node: True)
    assert fuse_gain_ms(near) > 0
    assert handler._choose(near, offered, None, "mm") == {"triton::mm": [{"BLOCK_M": 16}]}
    far, _, _ = _library_pick(0.020)  # 10 us slower unfused: more than the epilogue kernel it saves
    assert fuse_gain_ms(far) < 0 and handler._choose(far, offered, None, "mm") == {"aten::mm": [{}]}
    monkeypatch.setattr(handler_mod, "has_epilogue", lambda node: False)
    assert handler._choose(near, offered, None, "mm") == {"aten::mm": [{}]}
    assert handler.stats["fused"] == 1 and handler.stats["unfused"] == 2 and handler.stats["companion"] == 0


def test_a_predicted_fused_addmm_is_built_in_its_triton_call_only(monkeypatch):
    handler = gi.install(tune_on_miss=False)
    monkeypatch.setattr(handler_mod, "has_epilogue", lambda node: True)
    monkeypatch.setattr(handler_mod._Mixin, "_elsewhere", staticmethod(lambda primary, op, ki: True))
    pick, _, _ = _library_pick(0.011, op="addmm")
    assert handler._choose(pick, [_T("aten::addmm")], None, "addmm") == {}  # not the library kernel as well
    assert handler._choose(pick, [_T("triton::mm")], None, "addmm") == {"triton::mm": [{"BLOCK_M": 16}]}


def test_bad_fusion_and_measure_values_are_value_errors():
    with pytest.raises(ValueError, match="fusion"):
        gi.install(fusion=-1)
    with pytest.raises(ValueError, match="measure"):
        gi.install(measure="guess")


def test_inductor_timings_are_kept_and_a_changed_template_is_not_used():
    meta = lambda size, stride: TensorMeta(size, stride, torch.bfloat16, "cuda:0")  # noqa: E731
    ki = KernelInputs("mm", (meta((64, 32), (32, 1)), meta((32, 16), (1, 32))))
    store = Store(":memory:")
    entries = [({"template_id": "aten::mm"}, 0.020), ({"template_id": "triton::mm", "template_hash": "h1",
                                                      "BLOCK_M": 64, "EVEN_K": True}, 0.010)]
    best = timed.remember(ki, entries + [({"template_id": "triton::mm", "BLOCK_M": 32}, float("inf"))], store, env="e")
    assert best == entries[1][0]
    assert len(store.load("e", timed.problem_of(ki)).rows) == 2  # a failed (inf) timing is not kept
    assert timed.recall(ki, store, lambda uid: "h1", env="e") == entries[1][0]
    assert timed.recall(ki, store, lambda uid: "h2", env="e") is None  # the template's source changed
    later = timed.remember(ki, [({"template_id": "aten::mm"}, 0.001)], store, env="e")
    assert later == entries[1][0]  # the first stored pick stands


def test_on_timings_keeps_the_winner_of_the_choices_the_handler_handed_over(monkeypatch):
    handler = gi.install()
    meta = lambda size, stride: TensorMeta(size, stride, torch.float32, "cpu")  # noqa: E731
    ki = KernelInputs("mm", (meta((8, 4), (4, 1)), meta((4, 2), (2, 1))))
    store = Store(":memory:")
    monkeypatch.setattr(locations, "store_for", lambda settings: store)
    fast, slow, other = object(), object(), object()
    params = SimpleNamespace(to_kwargs=lambda: {"BLOCK_M": 32, "fn": print})
    handler._pending = [("k", ki, SimpleNamespace(_choice=fast, template=_T("triton::mm"), params=params)),
                        ("k", ki, SimpleNamespace(_choice=slow, template=_T("aten::mm"), params=params)),
                        ("k2", ki, SimpleNamespace(_choice=other, template=_T("aten::mm"), params=params))]
    handler.on_timings({fast: 0.01, slow: 0.02})
    assert handler.picks["k"].entries == ({"template_id": "triton::mm", "BLOCK_M": 32},)  # plain options only
    assert [p[0] for p in handler._pending] == ["k2"] and handler.stats["recorded"] == 1


def test_a_default_mode_compile_asks_gemmtune_and_benchmarks_nothing():
    w, b, v = torch.randn(24, 16), torch.randn(24), torch.randn(24, 8)

    def f(x):
        return torch.nn.functional.linear(x, w, b).relu() @ v

    x = torch.randn(8, 16)
    with gi.installed() as handler, gi.benchmark_probe() as probe:
        out = torch.compile(f, fullgraph=True)(x)
    torch.testing.assert_close(out, f(x))
    assert handler.stats["tuned"] == 2 and handler.stats["hit"] >= 2 and probe.choices == 0, handler.stats


def test_dynamic_shapes_compile_correctly_with_the_handler():
    w = torch.randn(16, 12)
    f = torch.compile(lambda x: (x @ w).relu(), dynamic=True, fullgraph=True)
    with gi.installed() as handler:
        for m in (8, 12, 20):
            x = torch.randn(m, 16)
            torch.testing.assert_close(f(x), (x @ w).relu())
    assert handler.stats["hit"] + handler.stats["miss"] >= 1  # asked at the size hint; every size correct


def test_a_traced_gemmtune_mm_lowers_to_aten_and_installs_the_handler(monkeypatch):
    from torch._inductor.utils import run_and_get_code

    tags = []
    real = engine.tune
    monkeypatch.setattr(engine, "tune", lambda *a, **k: tags.append(k.get("store_tag")) or real(*a, **k))
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    out, code = run_and_get_code(torch.compile(lambda x, w: torch.relu(gemmtune.mm(x, w)), fullgraph=True), x, w)
    torch.testing.assert_close(out, torch.relu(x @ w))
    from torch._inductor.virtualized import V

    assert handler_mod.is_gemmtune_handler(V.choices) and tags == ["inductor"]
    assert "torch.ops.gemmtune" not in "\n".join(code)


def test_compile_path_traced_keeps_the_traced_pick(monkeypatch):
    monkeypatch.setenv("GEMMTUNE_COMPILE_PATH", "traced")
    tags = []
    real = engine.tune
    monkeypatch.setattr(engine, "tune", lambda *a, **k: tags.append(k.get("store_tag")) or real(*a, **k))
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(torch.compile(lambda x, w: gemmtune.mm(x, w), fullgraph=True)(x, w), x @ w)
    assert tags == ["traced"]


def test_warmup_for_compile_fills_the_store_the_handler_reads(monkeypatch):
    tags = []
    real = engine.tune
    monkeypatch.setattr(engine, "tune", lambda *a, **k: tags.append(k.get("store_tag")) or real(*a, **k))
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))
    x = torch.randn(4, 16)
    report = gemmtune.warmup(mlp, x, for_compile=True, progress=False)
    assert report.tuned == 2 and tags == ["inductor", "inductor"]
    with torch.no_grad():
        out = torch.compile(mlp, fullgraph=True)(x)
        torch.testing.assert_close(out, mlp(x))
    from torch._inductor.virtualized import V

    handler = V.choices
    assert handler_mod.is_gemmtune_handler(handler) and handler.stats["store_hit"] >= 1, handler.stats
