"""bench/linear_forward_cost.py runs every variant on real CPU models and reads each against plain eager in
the same rounds; no timing is asserted (the rounds are too few to mean anything here)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def script(monkeypatch):
    # bench/models.py points the cache and store variables at scratch folders when imported, unless
    # it runs as a protocol child: keep this process's for the tests after this one.
    monkeypatch.setenv("GEMMTUNE_PROTOCOL_CHILD", "1")
    spec = importlib.util.spec_from_file_location("linear_forward_cost", ROOT / "bench" / "linear_forward_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = {k: v for k, v in os.environ.items() if k.startswith(("GEMMTUNE_", "TRITON_", "TORCHINDUCTOR_"))}
    yield module
    assert {k: v for k, v in os.environ.items() if k.startswith(("GEMMTUNE_", "TRITON_", "TORCHINDUCTOR_"))} == before


def test_every_variant_is_timed_against_plain_eager_and_computes_the_same(script, tmp_path):
    out = tmp_path / "cost.json"
    threads = torch.get_num_threads()
    try:
        assert script.main(["--width", "64", "--layers", "1", "--copies", "2", "--rounds", "3", "--iters", "1",
                            "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = json.loads(out.read_text())["rows"]
    assert list(rows) == list(script.VARIANTS)
    assert rows["eager"]["x_eager"] == 1.0
    assert all(r["us"] > 0 and r["lo"] <= r["x_eager"] <= r["hi"] for r in rows.values())


def test_each_variant_changes_the_layers_as_named(script):
    from gemmtune.dispatch.patching import patched_modules
    from gemmtune.dispatch.release import lean_forward

    base, x = script.build(64, 1)
    changed = {v: script.apply(v, __import__("copy").deepcopy(base)) for v in script.VARIANTS}
    linears = {v: [m for m in model.modules() if isinstance(m, torch.nn.Linear)] for v, model in changed.items()}
    assert patched_modules(changed["patched"]) and not any(patched_modules(changed[v]) for v in ("released", "lean", "warmed"))
    assert all("forward" in vars(m) for v in ("closure", "check", "decided") for m in linears[v])
    assert all(vars(m)["forward"].__func__ is lean_forward for m in linears["lean"] + linears["warmed"])
    assert all(type(m).__name__ == "BareLinear" for m in linears["subclass"])
    assert all(type(m) is torch.nn.Linear and "forward" not in vars(m) for m in linears["eager"] + linears["released"])
    with torch.no_grad():
        ref = base(x)
        assert all(torch.equal(model(x), ref) for model in changed.values())


def test_an_unknown_variant_or_a_missing_reference_is_refused(script):
    with pytest.raises(SystemExit, match="unknown"):
        script.main(["--variants", "eager,fast"])
    with pytest.raises(SystemExit, match="reference"):
        script.main(["--variants", "patched"])
