"""bench/serving.py, the every-batch-size protocol: its options are checked, GEMM kernels are told from
the rest by name, and a tiny run on the CPU covers every M in each variant: a range warm-up from a warm
store tunes nothing, no call tunes after the set-up, and the bucketed eager model agrees with eager."""

from __future__ import annotations

import json
import math

import pytest

from helpers import load_bench

serving = load_bench("serving")


def test_bad_options_are_refused_with_what_is_allowed(capsys):
    for argv in (["--m", "0,4"], ["--m", "x"], ["--m", ""], ["--first", "eager_range,static"], ["--steady", "nope"]):
        with pytest.raises(SystemExit) as exc:
            serving.parse_args(argv)
        assert exc.value.code == 2
    assert "eager_range_again" in capsys.readouterr().err
    a = serving.parse_args(["--m", "64,1,64,512"])
    assert a.m == [1, 64, 512] and "gemmtune_store" in a.first and "static" not in a.steady


def test_gemm_kernels_are_told_from_the_rest_by_name():
    gemm = ["nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
            "triton_tem_fused_mm_0", "gemm_kernel", "gemv_kernel", "void cutlass::Kernel2<...>", "skinny_kernel"]
    other = ["triton_poi_fused_add_mul_0", "triton_red_fused__to_copy_mean_pow_1", "flash_fwd_kernel",
             "void at::native::elementwise_kernel<128, 4>", "triton_per_fused_rsqrt_2"]
    assert all(serving.GEMM.search(k) for k in gemm) and not any(serving.GEMM.search(k) for k in other)


def test_a_tiny_run_covers_every_m_and_a_warm_range_warmup_tunes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_BACKENDS", "extern")  # torch's op only: seconds on a CPU
    out = tmp_path / "serving.json"
    assert serving.main(["--model", "tiny", "--m", "2,300", "--first", "eager_range,eager_range_again",
                         "--steady", "eager,eager_range", "--rounds", "2", "--iters", "1", "--root",
                         str(tmp_path / "caches"), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    first = {r["variant"]: r for r in res["first"]}
    assert set(first) == {"eager_range", "eager_range_again"}, res["first"]
    assert first["eager_range"]["tuned"] > 0 and first["eager_range_again"]["tuned"] == 0
    assert all(r["tunes_after_setup"] == 0 and set(r["first_s"]) == {"2", "300"} for r in first.values())
    rows = {(r["M"], r["variant"]): r for r in res["steady"]}
    assert set(rows) == {(m, v) for m in (2, 300) for v in ("eager", "eager_range")}, res["steady"]
    for (m, v), r in rows.items():
        assert r["rel_err"] < 1e-5 and math.isnan(r["ratio_vs_max_autotune"]) and r["ratio_vs_eager"] > 0
