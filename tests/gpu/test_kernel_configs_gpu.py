"""Configs Inductor tunes for its own kernels, through gemmtune's store (`inductor.kernel_configs`): a
default-mode compile at M = 1 times its vector products' reduction configs once; a new machine that
shares the store (new Inductor and Triton caches, a new process) compiles one config of each and
times none, and computes the same output.

    python -m pytest -q tests/gpu/test_kernel_configs_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import gemmtune.inductor as gi

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table")]

SIDE = r"""
import json, torch
import gemmtune.inductor as gi
from gemmtune.inductor import kernel_configs
from torch._inductor.runtime.triton_heuristics import CachingAutotuner

timed = []
real = CachingAutotuner.benchmark_all_configs
def counted(self, *args, **kwargs):
    timed.append(self.fn.__name__)
    return real(self, *args, **kwargs)
CachingAutotuner.benchmark_all_configs = counted
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 2048, bias=False), torch.nn.SiLU(),
                            torch.nn.Linear(2048, 1024, bias=False)).cuda().to(torch.bfloat16)
x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    gi.install()
    out = torch.compile(model)(x)
    ref = model(x)
err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
print(json.dumps(dict(timed=timed, stats=dict(kernel_configs.stats), out=out.float().flatten()[:64].tolist(), err=err)))
"""


def _machine(tmp_path, name: str) -> dict:
    """One compile in a new process with new Inductor and Triton caches, on the shared store."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"{name}-inductor"),
           "TRITON_CACHE_DIR": str(tmp_path / f"{name}-triton"), "GEMMTUNE_STORE": str(tmp_path / "store.sqlite"),
           "GEMMTUNE_CACHE_DIR": str(tmp_path / f"{name}-gemmtune")}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", SIDE], env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_new_machine_sharing_the_store_times_no_reduction_config(tmp_path):
    cold = _machine(tmp_path, "first")
    assert cold["timed"], cold  # the vector products' reductions with configs to time, timed once
    assert cold["stats"]["kept"] == len(cold["timed"]), cold["stats"]
    warm = _machine(tmp_path, "second")
    assert warm["timed"] == [], warm  # nothing timed: one config of each, served from the store
    assert warm["stats"]["served"] >= len(cold["timed"]) and warm["stats"]["kept"] == 0, warm["stats"]
    assert cold["err"] < 2e-2 and warm["err"] < 2e-2, (cold["err"], warm["err"])
    torch.testing.assert_close(torch.tensor(warm["out"]), torch.tensor(cold["out"]), rtol=0, atol=0)
