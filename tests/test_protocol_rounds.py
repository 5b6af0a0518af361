"""bench/protocol.py's steady-state figures: each ratio is paired within a round, and an eager variant is
also read against plain eager in the same rounds (the eager target's reading)."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("protocol_under_test", ROOT / "bench" / "protocol.py")
protocol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(protocol)


def test_ratios_are_paired_by_round_not_taken_of_medians():
    # eager drifts 2x between rounds; the warm-up variant is 5 % faster in every round.
    times = {"eager": [1.0, 2.0, 1.0, 2.0, 1.0], "eager_warmup": [0.95, 1.9, 0.95, 1.9, 0.95],
             "max_autotune": [0.5, 0.5, 0.5, 0.5, 0.5]}
    row = protocol.round_stats("eager_warmup", times)
    assert math.isclose(row["ratio_vs_eager"], 0.95)
    assert all(math.isclose(q, 0.95) for q in row["ratio_vs_eager_q1_q3"])
    assert row["round_ms"] == [0.95, 1.9, 0.95, 1.9, 0.95]
    assert math.isclose(row["ratio_vs_max_autotune"], 1.9)  # median of 1.9, 3.8, 1.9, 3.8, 1.9


def test_a_training_step_is_read_against_max_autotunes_step_and_compiled_variants_not_against_eager():
    times = {"eager": [3.0, 3.0, 3.0], "gemmtune": [1.0, 1.2, 1.1], "max_autotune": [1.0, 1.0, 1.0],
             "gemmtune+train": [4.0, 4.4, 4.2], "max_autotune+train": [4.0, 4.0, 4.0]}
    train = protocol.round_stats("gemmtune+train", times)
    assert math.isclose(train["ratio_vs_max_autotune"], 1.05)
    assert "ratio_vs_eager" not in protocol.round_stats("gemmtune", times)
    assert "ratio_vs_eager" not in train


def test_without_the_reference_in_the_rounds_the_ratio_is_nan_not_a_guess():
    row = protocol.round_stats("eager_warmup", {"eager_warmup": [1.0, 1.1], "eager": [1.0, 1.0]})
    assert math.isnan(row["ratio_vs_max_autotune"]) and all(math.isnan(q) for q in row["ratio_q1_q3"])
    assert math.isclose(row["ratio_vs_eager"], 1.05)
    assert "ratio_vs_eager" not in protocol.round_stats("eager_warmup", {"eager_warmup": [1.0]})


def test_the_patched_warm_up_variant_is_timed_from_the_warm_up_variants_store():
    assert protocol.STEADY_GROUP["eager_warmup_patched"] == protocol.FIRST["eager_warmup"][0]


@pytest.fixture
def variants_env(monkeypatch):
    """`protocol.compiled_variant` imports bench/models.py, which points the cache and store variables
    at fresh scratch folders on import unless it runs as a protocol child: keep this process's (every
    later test's store would be one shared folder), and check that they are kept."""
    def caches():
        return {k: v for k, v in os.environ.items() if k.startswith(("GEMMTUNE_", "TRITON_", "TORCHINDUCTOR_"))}

    monkeypatch.setenv("GEMMTUNE_PROTOCOL_CHILD", "1")
    before = caches()
    yield
    assert caches() == before


def test_every_a_a_control_is_plain_eager_on_the_copy_it_is_given(monkeypatch, variants_env):
    import torch
    import gemmtune
    from gemmtune.dispatch.patching import patched_modules

    def no_compile(*_a, **_k):
        raise AssertionError("an A/A control compiles nothing")
    monkeypatch.setattr(torch, "compile", no_compile)

    for variant in ("eager", "eager_copy", "eager_late"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 3))
        x = torch.randn(2, 4)
        fn, facts = protocol.compiled_variant(variant, model, (x,), torch, gemmtune)
        assert facts == {} and not patched_modules(model)  # nothing tuned, nothing patched
        assert torch.equal(fn(), model(x))


def test_the_closure_control_gives_each_linear_an_instance_forward_and_keeps_the_result(monkeypatch, variants_env):
    import torch
    from gemmtune.dispatch.patching import patched_modules

    monkeypatch.setattr(torch, "compile", lambda *_a, **_k: (_ for _ in ()).throw(AssertionError("compiled")))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3, bias=False))
    x = torch.randn(2, 4)
    ref = model(x)
    fn, facts = protocol.compiled_variant("eager_closure", model, (x,), torch, None)
    assert facts == {"layers": 2} and not patched_modules(model)
    assert all("forward" in vars(m) for m in model if isinstance(m, torch.nn.Linear))
    assert torch.allclose(fn(), ref)


def _control(variant: str):
    """A two-layer model set up as the eager control `variant`: (its callable, facts, layers, reference)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(2, 4)
    ref = model(x)
    fn, facts = protocol.compiled_variant(variant, model, (x,), torch, None)
    return fn, facts, [m for m in model if isinstance(m, torch.nn.Linear)], ref


def test_the_subclass_control_moves_each_linear_to_a_class_level_forward(variants_env):
    import torch

    fn, facts, linears, ref = _control("eager_subclass")
    assert facts == {"layers": 2} and all(type(m) is not torch.nn.Linear and "forward" not in vars(m) for m in linears)
    assert torch.allclose(fn(), ref)


def test_the_lean_control_gives_each_linear_the_released_forward_without_a_warm_up(variants_env):
    import torch
    from gemmtune.dispatch.patching import patch_report
    from gemmtune.dispatch.release import lean_forward

    fn, facts, linears, ref = _control("eager_lean")
    assert facts == {"layers": 2} and all(vars(m)["forward"].__func__ is lean_forward for m in linears)
    assert all(patch_report(m).not_routed[""].startswith("released") for m in linears)
    assert torch.equal(fn(), ref)


def test_an_eager_variant_runs_on_its_copies_in_turn_and_others_on_one(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("GEMMTUNE_PROTOCOL_CHILD", "1")  # importing bench/models.py leaves the caches alone
    monkeypatch.setattr(os, "environ", os.environ.copy())  # the set-up points the caches at `tmp_path`
    import models

    monkeypatch.setattr(models, "build", lambda name, m: (torch.nn.Sequential(torch.nn.Linear(4, 3)),
                                                          (torch.randn(2, 4),)))
    calls = []
    monkeypatch.setattr(protocol, "compiled_variant",
                        lambda variant, model, inputs, *_: ((lambda: calls.append((variant, id(model)))), {}))
    fns = protocol.steady_variants("tiny", 1, ["eager", "default"], tmp_path, False, torch, None, {}, copies=3)
    calls.clear()
    for _ in range(6):
        fns["eager"]()
        fns["default"]()
    eager = [model for variant, model in calls if variant == "eager"]
    assert len(set(eager)) == 3 and eager[:3] == eager[3:]  # three copies, called in turn
    assert len({model for variant, model in calls if variant == "default"}) == 1
