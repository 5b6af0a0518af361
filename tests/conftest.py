import os
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton templates run through Triton's interpreter.  The flag is
# read when a kernel is decorated, so it must be set before any kernel import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Short CPU timing windows keep the suite fast; timing quality is not under test here.
os.environ.setdefault("GEMMTUNE_CPU_REP_MS", "10")
os.environ.setdefault("GEMMTUNE_FINALIST_ROUNDS", "3")

REPO = Path(__file__).resolve().parents[1]
# Recorded data the tests replay, shipped with the package (docs/ARCHITECTURE.md): the exhaustive
# reference sweep of the plain Triton template on an H200, and the repo's benchmark suite.
SWEEP = REPO / "src" / "gemmtune" / "data" / "sweep_h200_bf16_triton_plain.jsonl.gz"
SHAPES = REPO / "bench" / "shapes.json"


@pytest.fixture(scope="session")
def replay_slice():
    """replay(path, names): a shipped sweep slice's replay shapes and the simulate report of the named
    strategy specs (the slices' tests)."""
    from gemmtune.offline.simulate import default_specs, load, select_specs, simulate

    def replay(path, names):
        shapes, dims = load(path)
        return shapes, simulate(shapes, select_specs(default_specs(shapes), names), dims)
    return replay


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_store(tmp_path, monkeypatch):
    """Each test gets its own empty store (numba's compiled kernels stay cached across tests)."""
    import gemmtune.store.locations
    import gemmtune.store.sqlite

    monkeypatch.setattr(gemmtune.store.sqlite, "default_cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(gemmtune.store.locations, "_STORES", {})
    gemmtune.clear_dispatch_cache()


@pytest.fixture
def memory_store(monkeypatch):
    """An in-memory store and an empty dispatch dict before and after the test (dispatch-level tests)."""
    import gemmtune

    monkeypatch.setenv("GEMMTUNE_STORE", "memory")
    gemmtune.clear_dispatch_cache()
    yield
    gemmtune.clear_dispatch_cache()


@pytest.fixture
def sweep_path():
    assert SWEEP.is_file(), f"the reference sweep ships in the repo: {SWEEP}"
    return SWEEP


@pytest.fixture
def aten_library():
    """Library problems pick torch's own kernel, whatever backends a test names: NumPy's BLAS (a library
    kernel that `F.linear` does not run, so its layer is never released) stays out of the pool."""
    from gemmtune.templates.heuristics import add_finalize_hook

    remove = add_finalize_hook(lambda ki, choices, op: [c for c in choices if c.template_uid != "numpy_blas"])
    yield
    remove()
