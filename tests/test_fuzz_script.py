"""bench/fuzz.py --kind mm (run with >= 1000 cases on a GPU) works end to end: a smoke run on the CPU
through Triton's interpreter, in the processes `--jobs` starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run is the real one")
def test_the_mm_fuzz_runs_every_kernel_on_every_case_and_finds_nothing_wrong(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "fuzz.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz.py"), "--kind", "mm", "--device", "cpu",
                           "--cases", "8", "--max-dim", "33", "--configs-per-case", "1", "--jobs", "2",
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["kind"] == "mm" and data["passed"] and data["findings"] == []
    assert data["counts"]["cases"] == 8 and data["counts"].get("wrong", 0) == 0
    assert data["counts"]["ok"] == data["counts"]["kernels run"] > 8  # the library kernel + Triton binaries
    assert "| cases | with NaN/Inf | kernels run | ok | wrong | error |" in proc.stdout
