"""nvMatmulHeuristics as a stage-0 cost model (CPU only: nvMH needs no GPU for a predefined one)."""

import math
import threading

import pytest
import torch

import gemmtune.search.nvmh as nvmh
from gemmtune.core.choices import Choice, as_params
from gemmtune.search.cost_model import estimate_ms
from gemmtune.search import ModelPrunedOptions, ProblemDims
from gemmtune.search.model_pruned import stage0
from gemmtune.templates.triton import mm as triton_mm, splitk as triton_splitk

BIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=8)
TINY = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_stages=3, num_warps=4)


def test_device_names_map_to_predefined_gpus():
    names = {"NVIDIA H200": "H200_SXM", "NVIDIA H200 NVL": "H200_SXM", "NVIDIA H100 80GB HBM3": "H100_SXM",
             "NVIDIA H100 PCIe": "H100_PCIE", "NVIDIA H100 NVL": "H100_NVL", "NVIDIA A100-SXM4-80GB": "A100_SXM_80GB",
             "NVIDIA A10": "A10_PCIE", "NVIDIA L40S": "L40S", "NVIDIA L4": "L4", "NVIDIA GeForce RTX 4090": "RTX_4090",
             "NVIDIA B200": "B200", "NVIDIA H20": "H20_SXM"}
    for device, gpu in names.items():
        assert nvmh.gpu_for(device) == gpu, device
    assert nvmh.gpu_for("cpu") is None and nvmh.gpu_for("Tesla T4") is None


def test_warp_splits_and_precision():
    assert nvmh.warp_splits(BIG)[0] == (64, 64)
    assert (16, 8) in nvmh.warp_splits(TINY)
    assert nvmh.precision_for(torch.bfloat16) == "TST" and nvmh.precision_for(torch.float16) == "HSH"


def test_fallback_without_the_package(monkeypatch):
    monkeypatch.setattr(nvmh, "available", lambda: False)
    assert nvmh.nvmh_model("NVIDIA H200") is None
    assert nvmh.rank_with_nvmh([Choice("t", "h", as_params(BIG))], ProblemDims(64, 64, 64), "NVIDIA H200") is None
    assert nvmh.stage0_model("NVIDIA H200") is estimate_ms
    h100 = nvmh.stage0_model("NVIDIA H100 80GB HBM3")
    assert h100.keywords["hw"].name == "H100 SXM"
    assert h100(TINY, 1, 65536, 65536) > estimate_ms(TINY, 1, 65536, 65536)  # memory-bound: lower bandwidth


# -- with the package --------------------------------------------------------------------------------



@pytest.fixture
def model():
    if not nvmh.available():
        pytest.skip("nvidia-matmul-heuristics not installed")
    m = nvmh.nvmh_model("NVIDIA H200", torch.bfloat16)
    assert m is not None
    return m


def test_estimates_are_finite_and_rank_big_tiles_first_on_big_problems(model):
    big, tiny = model(BIG, 4096, 14336, 4096), model(TINY, 4096, 14336, 4096)
    assert 0.3 < big < 3.0 and big < tiny
    bad = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, num_stages=3, num_warps=8)  # no warp split nvMH accepts
    assert model.estimate(bad, 4096, 4096, 4096) == math.inf
    assert model.estimate({"TILE": 8}, 64, 64, 64) == math.inf


def test_split_k_wins_for_long_k(model):
    M, N, K = 256, 256, 65536
    cfgs = triton_splitk.fit_configs(triton_splitk.config_space(), M, N, K, 2, 232448)
    cfgs += triton_mm.fit_configs(triton_mm.config_space(), M, N, K, 2, 232448)
    best = min(cfgs, key=lambda c: model(c, M, N, K))
    assert best.get("SPLIT_K", 1) > 1


def test_recommend_4096x14336x4096_bf16(model):
    recs = model.recommend(4096, 14336, 4096, count=8)
    assert recs and all(0.3 < r["est_ms"] < 3.0 for r in recs)
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps", "SPLIT_K", "swizzle"} <= set(recs[0])


def test_rank_with_nvmh_orders_templates_and_keeps_library_last(model):
    cs = [Choice("aten_mm", None), Choice("triton_mm", "h", as_params(TINY), as_params({"swizzle": 1}), family="triton"),
          Choice("triton_mm", "h", as_params(BIG), as_params({"swizzle": 8}), family="triton")]
    ranked = nvmh.rank_with_nvmh(cs, ProblemDims(4096, 14336, 4096), "NVIDIA H200", torch.bfloat16)
    assert ranked == [cs[2], cs[1], cs[0]]
    assert nvmh.rank_with_nvmh(cs, ProblemDims(4096, 14336, 4096), "AMD Instinct MI300X") is None


def test_as_stage0_model_of_model_pruned(model):
    M, N, K = 16, 4096, 14336
    mk = lambda uid, cfg: [Choice(uid, "h", as_params(cfg), as_params({"swizzle": s}), family="triton") for s in (1, 8)]  # noqa: E731
    choices = [Choice("aten_mm", None)]
    for cfg in triton_mm.fit_configs(triton_mm.config_space(), M, N, K, 2, 232448):
        choices += mk("triton_mm", cfg)
    for cfg in triton_splitk.fit_configs(triton_splitk.config_space(), M, N, K, 2, 232448):
        choices += mk("triton_splitk", cfg)
    kept = stage0(choices, ModelPrunedOptions(stage0_n=10, problem=ProblemDims(M, N, K), model=model))
    assert Choice("aten_mm", None) in kept
    assert len({c.binary_key for c in kept if not c.is_extern}) == 10
    assert any(c.template_uid == "triton_splitk" for c in kept)


def test_thread_safe_and_cached(model):
    results = []
    cfgs = triton_mm.fit_configs(triton_mm.config_space(), 2048, 2048, 2048, 2, 232448)[:40]

    def work():
        results.append([model(c, 2048, 2048, 2048) for c in cfgs])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == results[0] for r in results) and all(math.isfinite(x) for x in results[0])


def test_stage0_model_preference(model):
    assert nvmh.stage0_model("NVIDIA H200", torch.bfloat16) is model
    assert nvmh.stage0_model("NVIDIA H200", prefer="analytic") is estimate_ms
    with pytest.raises(ValueError):
        nvmh.stage0_model("NVIDIA H200", prefer="oracle")
