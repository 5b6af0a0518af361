"""bench/fp8_resources.py: the fp8 kernel's configs compiled for sm_90 on the CPU (Triton's own ptxas and
cuobjdump), their registers, spilled bytes and shared memory, and the sweep report built on them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRITON = importlib.util.find_spec("triton")
if TRITON is None or not TRITON.submodule_search_locations or not (
        Path(TRITON.submodule_search_locations[0]) / "backends" / "nvidia" / "bin" / "cuobjdump").is_file():
    pytest.skip("no Triton with NVIDIA's tools here", allow_module_level=True)
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("fp8_resources", ROOT / "bench" / "fp8_resources.py")
fp8_resources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp8_resources)

SM90_SHARED = 227 * 1024  # the most shared memory one block of an H100 or H200 may use


def _choice(cfg, gpu_ms, swizzle=1):
    return {"template": "triton_scaled_mm", "src_hash": "h", "family": "triton", "config": cfg,
            "runtime_params": {"swizzle": swizzle}, "ms": gpu_ms, "gpu_ms": gpu_ms, "host_ms": 0.001,
            "status": "ok", "compile_s": 2.0}


def _sweep(path: Path) -> Path:
    """One row-wise problem, two configs (the second at two swizzles) and cuBLASLt, which is ignored."""
    small = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=128, num_stages=4, num_warps=4)
    big = dict(BLOCK_M=64, BLOCK_N=16, BLOCK_K=128, num_stages=4, num_warps=4)
    shape = {"type": "shape", "name": "kv", "op": "scaled_mm", "M": 128, "K": 4096, "N": 1024, "scales": "rowwise",
             "choices": [_choice(small, 0.012), _choice(big, 0.011, 1), _choice(big, 0.010, 8),
                         {"template": "aten_scaled_mm", "family": "extern", "config": {}, "runtime_params": {},
                          "ms": 0.005, "gpu_ms": 0.005, "status": "ok"}]}
    path.write_text("\n".join(json.dumps(x) for x in ({"type": "meta", "device": "cuda"}, shape)) + "\n")
    return path


def test_a_sweep_s_configs_compile_for_sm90_and_the_report_reads_their_spills(tmp_path):
    # As a user runs it: its own process, without the interpreter the CPU tests run Triton under.
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "bench/fp8_resources.py", "--sweep", str(_sweep(tmp_path / "sweep.jsonl")),
                          "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {r["config"]: r for r in result["rows"]}
    assert set(rows) == {"32x16x128 s4 w4 rowwise", "64x16x128 s4 w4 rowwise"}
    for r in rows.values():
        assert "error" not in r and 0 < r["reg"] <= 255 and 0 < r["shared"] <= SM90_SHARED and r["stack"] >= 0
    assert result["summary"]["configs"] == 2 and result["summary"]["errors"] == 0
    shape = result["sweep"]["shapes"][0]
    assert shape["configs"] == 2 and shape["best"] == "64x16x128 s4 w4 rowwise"  # its best swizzle; cuBLASLt aside
    assert shape["best_spills"] == (rows["64x16x128 s4 w4 rowwise"]["stack"] > 0)
    assert "64x16x128 s4 w4 rowwise" in run.stdout


def test_the_report_counts_a_spilling_best_and_the_regret_of_dropping_spills():
    a, b, c = ((16, 16, 128, 4, 4), True), ((32, 16, 128, 4, 4), True), ((64, 16, 128, 4, 4), True)
    rows = {a: dict(config="a", stack=0), b: dict(config="b", stack=8), c: dict(config="c", stack=0)}
    shapes = [dict(name="one", configs={a: [0.0105, 1.0], b: [0.0100, 3.0], c: [0.0120, 1.0]}),
              dict(name="two", configs={a: [0.0100, 1.0], b: [0.0200, 3.0]})]
    report = fp8_resources.sweep_report(shapes, rows)
    assert report["best_spills"] == 1 and report["max_regret_without_spilling_pct"] == 5.0
    assert [s["best"] for s in report["shapes"]] == ["b", "a"]
    assert report["spilling_compile_share"] == round(6.0 / 9.0, 3)


def test_a_missing_sweep_exits_2_with_one_line(tmp_path, capsys):
    assert fp8_resources.main(["--sweep", str(tmp_path / "none.jsonl.gz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no sweep dataset" in err[0]
