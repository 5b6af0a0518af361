"""A graph's new problems timed together (`install(pipeline=True)`, `inductor.pipeline`): a default-mode
compile on the GPU times both new GEMMs through Inductor's pipelined autotuning, keeps their timings
in gemmtune's store, sets Inductor's flags back after the graph, and leaves a later max-autotune
compile in the same process working.  The program is a script without a `__main__` guard (as users
paste it): Inductor's benchmark worker must not run it again.  A second process on the same store
times nothing.

    python -m pytest -q tests/gpu/test_pipeline_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import gemmtune.inductor as gi
from gemmtune.inductor import pipeline

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table"),
              pytest.mark.skipif(not pipeline.available(), reason="this torch has no pipelined GEMM autotuning")]

SCRIPT = r"""
import json, torch
import gemmtune.inductor as gi
from torch._inductor import config
print("TOP-LEVEL RAN", flush=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 3072, bias=False), torch.nn.GELU(),
                            torch.nn.Linear(3072, 1024, bias=False)).cuda().to(torch.bfloat16)
x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
before = (config.pipeline_max_autotune_gemm, config.benchmark_epilogue_fusion)
with torch.no_grad(), gi.benchmark_probe() as probe:
    handler = gi.install(pipeline=True)
    out = torch.compile(model)(x)
    ref = model(x)
after = (config.pipeline_max_autotune_gemm, config.benchmark_epilogue_fusion)
gi.uninstall()
other = torch.nn.Linear(512, 768, bias=False).cuda().to(torch.bfloat16)
y = torch.randn(32, 512, device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    torch.testing.assert_close(torch.compile(other, mode="max-autotune-no-cudagraphs")(y), other(y), rtol=2e-2, atol=2e-2)
err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
print(json.dumps(dict(stats=dict(handler.stats), timed=probe.choices, before=before, after=after, err=err)))
"""


def _machine(tmp_path, name: str) -> tuple[dict, str]:
    """The script in a new process with new Inductor and Triton caches, on the shared store."""
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"{name}-inductor"),
           "TRITON_CACHE_DIR": str(tmp_path / f"{name}-triton"), "GEMMTUNE_STORE": str(tmp_path / "store.sqlite"),
           "GEMMTUNE_CACHE_DIR": str(tmp_path / f"{name}-gemmtune")}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


def test_a_graphs_new_problems_are_timed_together_and_kept(tmp_path):
    cold, stdout = _machine(tmp_path, "first")
    assert stdout.count("TOP-LEVEL RAN") == 1, stdout  # the benchmark worker did not run the script again
    assert cold["stats"].get("pipelined") == 2 and cold["stats"].get("recorded") == 2, cold["stats"]
    assert cold["timed"] > 2, cold  # both problems' candidates, timed in Inductor's worker
    assert cold["after"] == cold["before"], cold  # Inductor's flags set back after the graph
    assert cold["err"] < 2e-2, cold
    warm, _ = _machine(tmp_path, "second")
    assert warm["stats"].get("store_hit") == 2 and not warm["stats"].get("pipelined"), warm["stats"]
    assert warm["timed"] == 0 and warm["err"] < 2e-2, warm
