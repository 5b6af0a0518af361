"""bench/replay_readings.py: a sweep replayed with its GPU and host times handed to tune's final."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("replay_readings", ROOT / "bench" / "replay_readings.py")
replay_readings = importlib.util.module_from_spec(spec)
spec.loader.exec_module(replay_readings)


def _dataset(path: Path) -> Path:
    """One fp8-shaped problem: cuBLASLt fastest on the GPU but slowest to launch; two Triton configs."""
    def choice(template, family, cfg, gpu, host):
        return {"template": template, "src_hash": None if family == "extern" else "h", "family": family,
                "config": cfg, "runtime_params": {} if family == "extern" else {"swizzle": 1},
                "ms": max(gpu, host), "gpu_ms": gpu, "host_ms": host, "status": "ok"}
    meta = {"type": "meta", "format": "gemmtune-dataset/1", "device": "cuda"}
    shape = {"type": "shape", "name": "p", "op": "mm", "M": 16, "K": 64, "N": 64, "batch": 1, "dtype": "bfloat16",
             "problem_key": "mm 16x64x64", "choices": [
                 choice("aten_mm", "extern", {}, 0.010, 0.030),
                 choice("triton_mm", "triton", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "num_stages": 2,
                                                "num_warps": 1}, 0.014, 0.016),
                 choice("triton_mm", "triton", {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_stages": 2,
                                                "num_warps": 1}, 0.012, 0.017)]}
    path.write_text("\n".join(json.dumps(r) for r in (meta, shape)) + "\n")
    return path


def test_handed_the_readings_the_final_keeps_the_library_kernel_that_is_fastest_on_the_gpu(tmp_path):
    out = tmp_path / "r.json"
    assert replay_readings.main([str(_dataset(tmp_path / "d.jsonl")), "--strategy", "exhaustive",
                                 "--json", str(out)]) == 0
    rows = {r["readings_handed_on"]: r for r in json.loads(out.read_text())["rows"]}
    # By the recorded cost alone the Triton config launching in 16 us wins, and its regret by the cost is 0.
    assert "triton_mm" in rows[False]["pick"] and rows[False]["regret_ms_pct"] == 0.0
    assert rows[False]["regret_gpu_pct"] > 0.0
    # Handed the GPU times, the final's rule keeps the library kernel (faster on the GPU than every other).
    assert "aten_mm" in rows[True]["pick"] and rows[True]["regret_gpu_pct"] == 0.0
    assert rows[True]["regret_ms_pct"] > 50.0  # 30 us of launch against 17 us


def test_the_launch_reading_ties_configs_of_one_template_on_their_median_launch(tmp_path):
    shapes, _ = replay_readings.load(str(_dataset(tmp_path / "d.jsonl")))
    (recorded,) = replay_readings.readings(str(tmp_path / "d.jsonl"))
    cost = replay_readings.costs(shapes[0], recorded, 16)
    triton = sorted(v["launch"] for k, v in cost.items() if "triton_mm" in k)
    assert triton == pytest.approx([0.0165, 0.0165])  # both within 25 % of their median host time: they cost it
    assert [v["launch"] for k, v in cost.items() if "aten_mm" in k] == pytest.approx([0.030])


def test_a_strategys_pick_is_read_against_exhaustives_under_the_same_final_and_readings():
    costs_of = {"p": {"lib": {"ms": 0.030, "launch": 0.030, "gpu": 0.010, "gpu_pooled": 0.010},
                      "tri": {"ms": 0.016, "launch": 0.0165, "gpu": 0.012, "gpu_pooled": 0.012}}}
    rows = [{"shape": "p", "strategy": "exhaustive", "readings_handed_on": True, "pick": "lib"},
            {"shape": "p", "strategy": "prescreen", "readings_handed_on": True, "pick": "tri"},
            {"shape": "p", "strategy": "prescreen", "readings_handed_on": False, "pick": "tri"}]  # no exhaustive row
    replay_readings.against_exhaustive(rows, costs_of)
    assert rows[0]["vs_exhaustive_gpu_pct"] == 0.0
    assert rows[1]["vs_exhaustive_gpu_pct"] == pytest.approx(20.0)  # 12 us against exhaustive's 10 us
    assert rows[1]["vs_exhaustive_ms_pct"] == pytest.approx(100 * (0.016 / 0.030 - 1))  # faster by the cost
    assert "vs_exhaustive_gpu_pct" not in rows[2]


def test_the_summary_counts_the_share_of_choices_each_strategy_timed(tmp_path):
    out = tmp_path / "r.json"
    assert replay_readings.main([str(_dataset(tmp_path / "d.jsonl")), "--strategy", "exhaustive",
                                 "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert [s["runs_pct"] for s in summary] == [100.0, 100.0]  # exhaustive times all three choices
    assert all(s["vs_exhaustive_gpu_max_pct"] == 0.0 for s in summary)


def _repeats_dataset(path: Path) -> Path:
    """One 16-row problem: a 16-row tile at four swizzles (one kernel, read four times), a 32-row tile
    at two, and the library kernel."""
    def choice(template, cfg, swizzle, gpu):
        extern = template == "aten_mm"
        return {"template": template, "src_hash": None if extern else "h", "family": "extern" if extern else "triton",
                "config": cfg, "runtime_params": {} if extern else {"swizzle": swizzle},
                "ms": gpu, "gpu_ms": gpu, "host_ms": gpu / 2, "status": "ok"}
    small = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "num_stages": 2, "num_warps": 1}
    tall = dict(small, BLOCK_M=32)
    meta = {"type": "meta", "format": "gemmtune-dataset/1", "device": "cuda"}
    shape = {"type": "shape", "name": "p", "op": "mm", "M": 16, "K": 64, "N": 64, "batch": 1, "dtype": "bfloat16",
             "problem_key": "mm 16x64x64", "choices": [
                 choice("aten_mm", {}, None, 0.0125),
                 *(choice("triton_mm", small, s, g) for s, g in ((1, 0.0130), (2, 0.0100), (4, 0.0132), (8, 0.0128))),
                 *(choice("triton_mm", tall, s, g) for s, g in ((1, 0.0121), (8, 0.0123)))]}
    path.write_text("\n".join(json.dumps(r) for r in (meta, shape)) + "\n")
    return path


def test_repeats_of_one_kernel_are_pooled_and_their_spread_is_the_noise(tmp_path):
    data = _repeats_dataset(tmp_path / "d.jsonl")
    shapes, dims = replay_readings.load(str(data))
    (recorded,) = replay_readings.readings(str(data))
    assert dims[0].M == 16
    groups = sorted(len(g) for g in replay_readings.repeat_groups(list(shapes[0].times), dims[0].M))
    assert groups == [1, 2, 4]  # the library kernel; both tiles fill one row of tiles at every swizzle
    cost = replay_readings.costs(shapes[0], recorded, dims[0].M)
    lucky = next(k for k in cost if "swizzle=2" in k)
    assert cost[lucky]["gpu"] == pytest.approx(0.0100)  # the single reading: the fastest of all
    assert cost[lucky]["gpu_pooled"] == pytest.approx(0.0129)  # the median of its kernel's four readings
    assert min(cost, key=lambda k: cost[k]["gpu_pooled"]).startswith("triton_mm_bk32_bm32")
    spread = sorted(replay_readings.repeat_spread(shapes[0], recorded, dims[0].M))
    assert spread == pytest.approx([0.0002 / 0.0122, 0.0032 / 0.0129])


def test_with_more_rows_than_a_tile_the_swizzles_are_kernels_of_their_own(tmp_path):
    data = _repeats_dataset(tmp_path / "d.jsonl")
    shapes, _ = replay_readings.load(str(data))
    assert sorted(len(g) for g in replay_readings.repeat_groups(list(shapes[0].times), 128)) == [1, 1, 1, 1, 1, 1, 1]
    # on 4 rows of 16-row tiles, swizzles 4 and 8 both take the whole grid as one group: one kernel
    assert sorted(len(g) for g in replay_readings.repeat_groups(list(shapes[0].times), 64)) == [1, 1, 1, 1, 1, 2]


def test_a_dataset_without_gpu_and_host_readings_exits_2_naming_it(tmp_path, capsys):
    """A sweep recorded before the readings were kept (the shipped bf16 Triton slice) has nothing to
    replay: one line on stderr and exit 2, not a statistics error."""
    dataset = ROOT / "src" / "gemmtune" / "data" / "sweep_h200_bf16_triton_plain.jsonl.gz"
    assert replay_readings.main([str(dataset), "--strategy", "default"]) == 2
    err = capsys.readouterr().err
    assert "no shape with GPU and host readings" in err and dataset.name in err
