"""The in-model check on a GPU: a warm-up checks every generated pick in the model's own forward and
the model then runs what the check decided, with outputs within bf16 tolerance.

    python -m pytest -q -s tests/gpu/test_in_model_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.dispatch import patching

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _store(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMTUNE_STORE", str(tmp_path / "store.sqlite"))
    gemmtune.clear_dispatch_cache()
    yield
    gemmtune.clear_dispatch_cache()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(1024, 2048, bias=False), nn.SiLU(), nn.Linear(2048, 768), nn.SiLU(), nn.Linear(768, 1024)]
    return nn.Sequential(*layers).cuda().bfloat16()


@pytest.mark.parametrize("m", [1, 64])
def test_the_model_runs_what_the_in_model_check_decided(m):
    plain, model = _mlp(), _mlp()
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    report = gemmtune.warmup(model, x, progress=False)
    print("\n" + report.table())
    generated = [r for r in report.rows if not r.winner.startswith("aten")]
    assert all(r.in_model is not None for r in generated)  # on by default on a GPU
    assert all(r.in_model is None for r in report.rows if r.winner.startswith("aten"))
    with torch.no_grad():
        out, ref = model(x), plain(x)
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err < 2e-2, err
    torch_runs = sum(fn is torch.nn.functional.linear for fn in patching._LINEAR.values())
    assert torch_runs == sum(r.runs.startswith(("aten", "torch")) for r in report.rows)
    # three layers, three problems: those that run torch's op are released, the others stay patched
    assert len(report.released) == torch_runs and len(patching.patched_modules(model)) == 3 - torch_runs


def test_the_check_is_off_when_asked():
    model = _mlp()
    x = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    report = gemmtune.warmup(model, x, progress=False, in_model=False)
    assert all(r.in_model is None for r in report.rows) and report.check_s == 0.0


def test_a_second_warm_up_applies_the_kept_verdicts_and_runs_what_they_say():
    """A later process (here: the dispatch forgotten) warming up the same model from the same store
    reads the check's verdicts instead of timing them (`dispatch.verdicts`)."""
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    first = gemmtune.warmup(_mlp(), x, progress=False)
    gemmtune.clear_dispatch_cache()
    plain, model = _mlp(), _mlp()
    second = gemmtune.warmup(model, x, progress=False)
    print("\n" + second.table())
    checked = [r for r in first.rows if r.in_model is not None]
    assert [(r.problem, r.runs) for r in checked] == [(r.problem, r.runs) for r in second.rows if r.in_model]
    assert all(r.in_model.stored for r in second.rows if r.in_model is not None)
    with torch.no_grad():
        out, ref = model(x), plain(x)
    assert (out.float() - ref.float()).norm() / ref.float().norm() < 2e-2
    torch_runs = sum(fn is torch.nn.functional.linear for fn in patching._LINEAR.values())
    assert torch_runs == sum(r.runs.startswith(("aten", "torch")) for r in second.rows)
