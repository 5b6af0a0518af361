"""gemmtune.warmup: one forward collects a model's GEMM problems; they are tuned together; a second
run of the same program reads the store and tunes nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune import engine
from gemmtune.store import locations
from gemmtune.dispatch import eager
from gemmtune.dispatch.release import lean_forward


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    # two layers of one shape (8 -> 8) meet the same problem: one row, two calls
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4, bias=False))


def test_warmup_tunes_each_distinct_problem_once_and_the_forward_then_tunes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMTUNE_STORE", str(tmp_path / "store.db"))
    gemmtune.clear_dispatch_cache()
    model, x = _mlp(), torch.randn(5, 8)
    ref = model(x)
    report = gemmtune.warmup(model, x, backends=("extern",), progress=False)
    assert [r.calls for r in report.rows] == [2, 1]
    assert report.rows[0].problem.startswith("addmm") and report.rows[1].problem.startswith("mm")
    assert report.tuned == 2 and report.from_store == 0
    tunes = gemmtune.dispatch_stats()["tunes"]
    out = model(x)
    assert gemmtune.dispatch_stats()["tunes"] == tunes
    assert torch.allclose(out, ref, atol=1e-6)
    assert "2 GEMM problems: 2 tuned, 0 from the store" in report.table()


def test_second_run_reads_the_store(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMTUNE_STORE", str(tmp_path / "store.db"))
    gemmtune.clear_dispatch_cache()
    gemmtune.warmup(_mlp(), torch.randn(5, 8), backends=("extern",), progress=False)
    gemmtune.clear_dispatch_cache()  # a new process: nothing in the dispatch dict, the store on disk
    locations._STORES.clear()
    again = gemmtune.warmup(_mlp(), torch.randn(5, 8), backends=("extern",), progress=False)
    assert again.tuned == 0 and again.from_store == 2


def test_recording_tunes_nothing_and_computes_what_torch_computes(monkeypatch):
    calls = []
    monkeypatch.setattr(engine, "tune", lambda *a, **k: calls.append(a) or None)
    a, b, bias = torch.randn(6, 4), torch.randn(4, 3), torch.randn(3)
    with eager.recording() as seen:
        out = eager.addmm(bias, a, b, beta=0.5, alpha=2.0)
        out2 = eager.mm(a, b)
    assert calls == []
    assert torch.allclose(out, torch.addmm(bias, a, b, beta=0.5, alpha=2.0))
    assert torch.allclose(out2, a @ b)
    assert sorted(r.op for r in seen.values()) == ["addmm", "mm"]


def test_recording_sees_problems_already_dispatched_and_restores_the_dict():
    gemmtune.clear_dispatch_cache()
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    gemmtune.mm(a, b, backends=("extern",))
    entries = gemmtune.dispatch_stats()["entries"]
    with eager.recording() as seen:
        gemmtune.mm(a, b, backends=("extern",))
    assert len(seen) == 1
    assert gemmtune.dispatch_stats()["entries"] == entries
    hits = gemmtune.dispatch_stats()["hits"]
    gemmtune.mm(a, b, backends=("extern",))
    assert gemmtune.dispatch_stats()["hits"] == hits + 1


def test_progress_bar_and_patched_model(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMTUNE_STORE", "memory")
    gemmtune.clear_dispatch_cache()
    model = gemmtune.patch(_mlp(), backends=("extern",))
    report = gemmtune.warmup(model, torch.randn(3, 8), progress=True)
    assert len(report.rows) == 2 and all(r.winner for r in report.rows)


class _Two(nn.Module):
    """Three layers: `wide` (K = 24) and `narrow` (K = 8) are called, `spare` never is."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wide, self.narrow, self.spare = nn.Linear(24, 8, bias=False), nn.Linear(8, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.narrow(torch.relu(self.wide(x)))


def test_release_gives_library_layers_their_own_forward_and_keeps_generated_picks(monkeypatch, tmp_path, aten_library):
    """The K = 24 problem is tuned among numba kernels only (a generated pick), the others among
    library kernels: only the library layer is released; outputs stay right; a new shape on the
    released layer is no longer tuned, on the kept one it is."""
    from gemmtune.dispatch import patching

    monkeypatch.setenv("GEMMTUNE_STORE", str(tmp_path / "store.db"))
    gemmtune.clear_dispatch_cache()
    real = engine.tune

    def tune(op, *t, backends=None, **kw):
        return real(op, *t, backends=("numba",) if t[-2].shape[-1] == 24 else ("extern",), **kw)

    monkeypatch.setattr(engine, "tune", tune)
    model, x = _Two(), torch.randn(6, 24)
    with torch.no_grad():
        ref = model(x)
    # in_model=False: the numba pick stays (the in-model check, on by default, may send it to torch's op)
    report = gemmtune.warmup(model, x, progress=False, release=True, in_model=False)
    assert report.released == ("narrow",)
    assert patching.patched_modules(model) == ["wide", "spare"]  # spare: never called, left as it was
    assert vars(model.narrow)["forward"].__func__ is lean_forward and "released 1 layers" in report.table()
    assert "released by gemmtune.warmup" in patching.patch_report(model).not_routed["narrow"]
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-4)
        tunes = gemmtune.dispatch_stats()["tunes"]
        model(torch.randn(3, 24))  # new shape: `wide` tunes it, `narrow` (released) runs torch's op
    assert gemmtune.dispatch_stats()["tunes"] == tunes + 1


def test_release_is_for_eager_use():
    with pytest.raises(gemmtune.InputError, match="release=True applies to eager use"):
        gemmtune.warmup(_Two(), torch.randn(2, 24), progress=False, release=True, for_compile=True)
