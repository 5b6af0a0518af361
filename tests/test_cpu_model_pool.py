"""NumPy's BLAS (another thread pool than torch's) is opt-in: it never enters a pool by default (a
patched model's, `backends=("extern",)`, a plain tune's), and a pick that is not torch's own op is
checked in the model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.dispatch import eager
from gemmtune.templates.heuristics import add_finalize_hook

pytestmark = pytest.mark.usefixtures("memory_store")


def _block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 24), nn.GELU(), nn.Linear(24, 16, bias=False))


def _pooled() -> set[str]:
    """Every template any selection of this process timed (or pinned)."""
    return {t.choice.template_uid for sel in eager.selections().values() for t in sel.timings}


@pytest.mark.parametrize("backends", [None, ("extern",), ("extern", "numba")])
def test_a_patched_cpu_model_never_pools_numpy_blas_unless_asked(backends):
    model, x = _block(), torch.randn(8, 16)
    gemmtune.warmup(model, x, backends=backends, progress=False, in_model=False)
    pooled = _pooled()
    assert "numpy_blas" not in pooled and {"aten_addmm", "aten_mm"} <= pooled
    assert ("numba_mm" in pooled) == (backends != ("extern",))


def test_numpy_blas_joins_a_model_only_by_name_and_is_then_checked_in_the_model():
    pin = add_finalize_hook(lambda ki, choices, op: [c for c in choices if c.template_uid == "numpy_blas"] or choices)
    try:
        model, x = _block(), torch.randn(8, 16)
        with torch.no_grad():
            ref = model(x)
        report = gemmtune.warmup(model, x, backends=("extern", "numpy"), progress=False)
    finally:
        pin()
    assert [r.winner for r in report.rows] == ["numpy_blas", "numpy_blas"]
    assert all(r.in_model is not None for r in report.rows), report.table()  # on by default on CPU too
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref)


def test_a_plain_tune_pools_numpy_blas_only_when_named():
    a, b = torch.randn(8, 16), torch.randn(16, 8)
    settings = gemmtune.Settings(store="memory", effort="quick")
    for backends, pooled in ((None, False), (("extern",), False), (("extern", "numpy"), True), (("numpy",), True)):
        sel = gemmtune.tune("mm", a, b, backends=backends, settings=settings)
        assert ("numpy_blas" in {t.choice.template_uid for t in sel.timings}) == pooled, backends
