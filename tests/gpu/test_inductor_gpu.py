"""gemmtune feeding Inductor on a GPU (`gemmtune.inductor`): Triton picks become Inductor's own Triton
template choices, with max-autotune-no-cudagraphs / max-autotune, fullgraph=True and two GEMMs per
graph; with a warm table Inductor benchmarks nothing.

    python -m pytest -q tests/gpu/test_inductor_gpu.py
"""

from __future__ import annotations

import re

import pytest
import torch

import gemmtune
import gemmtune.inductor as gi
from gemmtune.core.choices import Choice, as_params
from gemmtune.core.inputs import KernelInputs
from gemmtune.inductor.entries import TILE_KEYS
from gemmtune.templates.triton.mm import TritonMMTemplate

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table")]

M, K, N, P = 256, 1024, 512, 384
TILE = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_stages=3, num_warps=4)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    from torch._inductor import config

    monkeypatch.setenv("GEMMTUNE_STORE", str(tmp_path / "store.sqlite"))
    torch._dynamo.reset()
    with config.patch(fx_graph_cache=False, autotune_local_cache=False):
        yield
    from gemmtune.inductor import installer

    while installer._PRIOR:
        gi.uninstall()
    torch._dynamo.reset()


def two_gemms(x, w1, w2):
    return (x @ w1).relu() @ w2


def operands():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    return torch.randn(M, K, **bf), torch.randn(K, N, **bf) / 32, torch.randn(N, P, **bf) / 16


def _close(out, ref):
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err < 2e-2, f"relative error {err:.3e}"


def _problems(x, w1, w2):
    h = (x @ w1).relu()
    return KernelInputs.from_tensors("mm", x, w1), KernelInputs.from_tensors("mm", h, w2)


def _tile_in_code(code: str, tile: dict) -> bool:
    return all(re.search(rf"{k}\s*:\s*tl\.constexpr\s*=\s*{tile[k]}\b", code) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))


def test_exported_triton_picks_are_inductors_only_choices():
    from torch._inductor.utils import run_and_get_code

    args = operands()
    picks = []
    for ki, swizzle in zip(_problems(*args), (8, 4)):
        pick = Choice("triton_mm", "h", as_params(TILE), as_params({"swizzle": swizzle}))
        picks.append(gi.entries_for(ki, pick, keys=gi.problem_keys(ki)))
    table = gi.table_for(picks)
    with gi.installed(table, tune_on_miss=False) as handler, gi.benchmark_probe() as probe:
        f = torch.compile(two_gemms, mode="max-autotune-no-cudagraphs", fullgraph=True)
        out, code = run_and_get_code(f, *args)
    _close(out, two_gemms(*args))
    assert probe.choices == 0 and probe.autotuned == 0
    assert [(op, uid) for op, uid, _ in handler.built] == [("mm", "triton::mm"), ("mm", "triton::mm")]
    assert [kw["GROUP_M"] for _, _, kw in handler.built] == [8, 4]
    assert _tile_in_code("\n".join(code), TILE)
    _close(f(*args), two_gemms(*args))


def test_a_tuned_triton_pick_exports_and_inductor_builds_it():
    args = operands()
    ki = _problems(*args)[0]
    sel = gemmtune.tune("mm", args[0], args[1], templates=[TritonMMTemplate()],
                        settings=gemmtune.Settings(effort="quick"))
    assert sel.winner.template_uid == "triton_mm"
    pick = gi.pick_for_selection(sel)
    assert pick.exact and pick.entries[0]["template_id"] == "triton::mm"
    assert gi.problem_keys(ki)[0] in gi.table_for([sel])
    with gi.installed(gi.table_for([sel]), tune_on_miss=False) as handler, gi.benchmark_probe() as probe:
        out = torch.compile(lambda a, b: (a @ b).relu(), mode="max-autotune-no-cudagraphs", fullgraph=True)(*args[:2])
    _close(out, (args[0] @ args[1]).relu())
    assert probe.choices == 0
    built = handler.built[0][2]
    assert {k: built[k] for k in (*TILE_KEYS, "GROUP_M")} == {
        **{k: sel.winner.config_dict[k] for k in TILE_KEYS}, "GROUP_M": sel.winner.runtime_dict["swizzle"]}


@pytest.mark.parametrize("mode", ["max-autotune-no-cudagraphs", "max-autotune"])
def test_install_tunes_misses_then_a_warm_store_benchmarks_nothing(mode):
    args = operands()
    for round_ in range(2):  # cold store, then a fresh handler on the warm store
        with gi.installed(fusion=False, measure="gemmtune") as handler, gi.benchmark_probe() as probe:
            f = torch.compile(two_gemms, mode=mode, fullgraph=True)
            out = f(*args).clone()  # CUDA graphs (max-autotune) reuse their output buffers
            _close(f(*args).clone(), two_gemms(*args))
        torch._dynamo.reset()
        _close(out, two_gemms(*args))
        assert handler.stats["tuned"] == 2 and handler.stats["miss"] == 0, (round_, handler.stats)
        assert probe.choices == 0, (round_, probe.names)
        assert len(handler.built) == 2


@pytest.mark.parametrize("fusion", [True, False])
def test_a_library_pick_with_its_fusion_companion_lets_inductor_weigh_the_epilogue(fusion):
    from gemmtune.inductor.entries import Measured, entries_for

    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, w = torch.randn(16, K, **bf), torch.randn(K, N, **bf) / 32
    ki = KernelInputs.from_tensors("mm", x, w)
    tile = Choice("triton_mm", TritonMMTemplate.src_hash, as_params(TILE), as_params({"swizzle": 8}))
    measured = [Measured("aten_mm", {}, {}, 0.010), Measured("triton_mm", TILE, {"swizzle": 8}, 0.011)]
    pick = entries_for(ki, Choice("aten_mm", None), measured, keys=gi.problem_keys(ki))
    assert pick.companions and pick.companions[0]["BLOCK_M"] == tile.config_dict["BLOCK_M"]
    with gi.installed(tune_on_miss=False, fusion=fusion) as handler, gi.benchmark_probe() as probe:
        handler.add(pick)
        out = torch.compile(lambda a, b: (a @ b).relu() * 2, mode="max-autotune-no-cudagraphs", fullgraph=True)(x, w)
    _close(out, (x @ w).relu() * 2)
    built = sorted(uid for _, uid, _ in handler.built)
    assert built == (["aten::mm", "triton::mm"] if fusion else ["aten::mm"]), handler.built
    assert probe.choices == (2 if fusion else 0), probe.names


def test_linear_layers_addmm_and_bmm():
    lin = torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.GELU(), torch.nn.Linear(N, P)).cuda().bfloat16()
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    a, b = (torch.randn(8, 128, 64, device="cuda", dtype=torch.bfloat16),
            torch.randn(8, 64, 96, device="cuda", dtype=torch.bfloat16))
    with gi.installed(fusion=False, measure="gemmtune") as handler, gi.benchmark_probe() as probe, torch.no_grad():
        out = torch.compile(lin, mode="max-autotune-no-cudagraphs", fullgraph=True)(x)
        out_b = torch.compile(torch.bmm, mode="max-autotune-no-cudagraphs", fullgraph=True)(a, b)
    _close(out, lin(x))
    _close(out_b, torch.bmm(a, b))
    assert probe.choices == 0, probe.names
    assert {op for op, _, _ in handler.built} <= {"addmm", "mm", "bmm"} and "bmm" in {op for op, _, _ in handler.built}


def test_a_tma_pick_is_inductors_persistent_tma_template_or_its_tile():
    from torch._inductor import config

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs compute capability 9.0")
    args = operands()
    ki = _problems(*args)[0]
    tile = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=3, num_warps=8)
    pick = gi.entries_for(ki, Choice("triton_tma_persistent", "h", as_params({**tile, "EPILOGUE_SUBTILE": 0}),
                                     as_params({"swizzle": 8})), keys=gi.problem_keys(ki))
    with config.patch({"triton.enable_persistent_tma_matmul": True}):
        with gi.installed(gi.table_for([pick]), tune_on_miss=False) as handler, gi.benchmark_probe() as probe:
            out = torch.compile(lambda a, b: (a @ b).relu(), mode="max-autotune-no-cudagraphs",
                                fullgraph=True)(*args[:2])
    _close(out, (args[0] @ args[1]).relu())
    assert probe.choices == 0
    assert handler.built[0][1] in ("triton::mm_persistent_tma", "triton::mm")  # the tile stands in without TMA
    assert handler.built[0][2]["BLOCK_M"] == 128


def test_a_split_k_pick_lets_inductor_time_only_a_few():
    a = torch.randn(32, 16384, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(16384, 32, device="cuda", dtype=torch.bfloat16) / 128
    ki = KernelInputs.from_tensors("mm", a, b)
    split = Choice("triton_splitk", "h", as_params(dict(TILE, BLOCK_M=32, BLOCK_N=32, SPLIT_K=8)),
                   as_params({"swizzle": 8}))
    pick = gi.entries_for(ki, split, keys=gi.problem_keys(ki))
    assert not pick.exact and pick.entries[0] == {"template_id": "decompose_k", "k_split": 8}
    with gi.installed(gi.table_for([pick]), tune_on_miss=False), gi.benchmark_probe() as probe:
        out = torch.compile(lambda x, y: x @ y, mode="max-autotune-no-cudagraphs", fullgraph=True)(a, b)
    _close(out, a @ b)
    assert probe.choices <= len(pick.entries), probe.names


def test_fed_compile_is_not_served_from_a_plain_compile_in_the_fx_graph_cache(tmp_path, monkeypatch):
    """A graph compiled without gemmtune, cached, must not answer the same graph compiled with it:
    the installed factory's pickle (the handler's uuid) is part of Inductor's FX-graph cache key."""
    from torch._inductor import config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x, w1, w2 = operands()
    with config.patch(fx_graph_cache=True, autotune_local_cache=True):
        torch.compile(two_gemms, mode="max-autotune-no-cudagraphs", fullgraph=True)(x, w1, w2)
        torch._dynamo.reset()
        with gi.installed() as handler:
            out = torch.compile(two_gemms, mode="max-autotune-no-cudagraphs", fullgraph=True)(x, w1, w2)
    _close(out, two_gemms(x, w1, w2))
    asked = handler.stats["hit"] + handler.stats["miss"] + handler.stats["timed_in_inductor"]
    assert asked >= 2, handler.stats  # consulted: not a cache replay


@pytest.mark.parametrize("mode", [None])  # the default mode (max-autotune's epilogue benchmark defers the timings)
def test_a_new_problem_is_timed_once_on_inductors_kernels_then_built_from_the_store(mode):
    args = operands()
    for round_ in range(2):  # cold store: Inductor times its candidates; then a fresh handler, warm store
        torch._dynamo.reset()
        with gi.installed(fusion=False) as handler, gi.benchmark_probe() as probe:
            out = torch.compile(two_gemms, mode=mode, fullgraph=True)(*args)
        _close(out, two_gemms(*args))
        if round_ == 0:
            assert handler.stats["timed_in_inductor"] >= 2 and handler.stats["recorded"] >= 2, handler.stats
            assert probe.choices > 2, probe.names
        else:
            assert handler.stats["store_hit"] >= 2 and handler.stats["timed_in_inductor"] == 0, handler.stats
            assert probe.choices == 0, probe.names


def test_a_default_mode_compile_builds_a_triton_pick_and_benchmarks_nothing():
    from gemmtune.inductor.entries import entries_for

    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, w = torch.randn(64, K, **bf), torch.randn(K, N, **bf) / 32
    ki = KernelInputs.from_tensors("mm", x, w)
    tile = Choice("triton_mm", TritonMMTemplate.src_hash, as_params(TILE), as_params({"swizzle": 8}))
    with gi.installed(tune_on_miss=False) as handler, gi.benchmark_probe() as probe:
        handler.add(entries_for(ki, tile, keys=gi.problem_keys(ki)))
        out = torch.compile(lambda a, b: (a @ b).relu(), fullgraph=True)(x, w)  # the default mode
    _close(out, (x @ w).relu())
    assert [uid for _, uid, _ in handler.built] == ["triton::mm"], handler.built
    assert probe.choices == 0, probe.names


@pytest.mark.parametrize("gemv", [True, "autotune", False])
def test_a_default_mode_vector_product_is_a_reduction_tuned_by_coordinate_descent(gemv):
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048, bias=False), torch.nn.SiLU(),
                                torch.nn.Linear(2048, 1024, bias=False)).cuda().to(torch.bfloat16)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), gi.installed(gemv=gemv) as handler:
        out, code = run_and_get_code(torch.compile(model), x)
    text = "\n".join(code)
    assert (handler.stats["vector_product"] == 2) is bool(gemv), handler.stats
    assert ("'coordinate_descent_tuning': True" in text) is (gemv is True)
    assert ("'max_autotune_pointwise': True" in text) is (gemv == "autotune")
    torch.testing.assert_close(out.float(), model(x).float(), rtol=2e-2, atol=2e-2)


def test_a_training_steps_backward_meets_the_handler_after_a_plain_compiles_backward():
    """The backward graph is compiled in autograd's device thread.  A plain compile's backward ran
    there first, so Inductor made that thread's handler before install(); the gemmtune backward must
    still meet gemmtune's handler: its M = 1 products become reductions and its weight gradients
    (K = 1) broadcast multiplies, and the gradients match eager's."""
    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048, bias=False), torch.nn.SiLU(),
                                torch.nn.Linear(2048, 1024, bias=False)).to(**bf)
    x = torch.randn(1, 1024, **bf)

    def grads(fn):
        model.zero_grad(set_to_none=True)
        fn(x).float().pow(2).mean().backward()
        return [p.grad.float().clone() for p in model.parameters()]

    ref = grads(model)
    grads(torch.compile(model))  # a plain compile's backward: the device thread's handler is made now
    torch._dynamo.reset()
    with gi.installed() as handler:
        got = grads(torch.compile(model))
    assert handler.stats["outer_product"] == 2, handler.stats  # both weight gradients
    assert handler.stats["vector_product"] >= 3, handler.stats  # 2 in the forward, >= 1 in the backward
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=3e-2, atol=3e-2)
