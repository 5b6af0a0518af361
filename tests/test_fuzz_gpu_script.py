"""bench/fuzz_gpu.py (run with >= 1000 cases on an H200) works end to end: smoke run through the interpreter."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run is the real one")
def test_fuzz_script_smoke_run(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "fuzz.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz_gpu.py"), "--device", "cpu", "--cases", "8",
                           "--max-dim", "33", "--configs-per-case", "1", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["counts"]["cases"] == 8 and data["counts"].get("wrong", 0) == 0
    assert data["counts"]["ok"] > 8  # library kernel + Triton binaries x swizzles per case
    assert "| cases |" in proc.stdout
