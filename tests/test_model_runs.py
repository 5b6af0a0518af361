"""bench/model_runs.py, the whole-model protocol's child processes: each steady-state ratio is paired
within a round, an eager variant is also read against plain eager in the same rounds, the A/A controls
are plain eager on copies of their own, and bench/models.py refuses a variant the protocol does not have."""

from __future__ import annotations

import math

import pytest

from helpers import load_bench

runs = load_bench("model_runs")


def test_ratios_are_paired_by_round_not_taken_of_medians():
    # eager drifts 2x between rounds; the warm-up variant is 5 % faster in every round.
    times = {"eager": [1.0, 2.0, 1.0, 2.0, 1.0], "eager_warmup": [0.95, 1.9, 0.95, 1.9, 0.95],
             "max_autotune": [0.5, 0.5, 0.5, 0.5, 0.5]}
    row = runs.round_stats("eager_warmup", times)
    assert math.isclose(row["ratio_vs_eager"], 0.95)
    assert all(math.isclose(q, 0.95) for q in row["ratio_vs_eager_q1_q3"])
    assert row["round_ms"] == [0.95, 1.9, 0.95, 1.9, 0.95]
    assert math.isclose(row["ratio_vs_max_autotune"], 1.9)  # median of 1.9, 3.8, 1.9, 3.8, 1.9


def test_a_training_step_is_read_against_max_autotunes_step_and_compiled_variants_not_against_eager():
    times = {"eager": [3.0, 3.0, 3.0], "gemmtune": [1.0, 1.2, 1.1], "max_autotune": [1.0, 1.0, 1.0],
             "gemmtune+train": [4.0, 4.4, 4.2], "max_autotune+train": [4.0, 4.0, 4.0]}
    train = runs.round_stats("gemmtune+train", times)
    assert math.isclose(train["ratio_vs_max_autotune"], 1.05)
    assert "ratio_vs_eager" not in runs.round_stats("gemmtune", times)
    assert "ratio_vs_eager" not in train


def test_without_the_reference_in_the_rounds_the_ratio_is_nan_not_a_guess():
    row = runs.round_stats("eager_warmup", {"eager_warmup": [1.0, 1.1], "eager": [1.0, 1.0]})
    assert math.isnan(row["ratio_vs_max_autotune"]) and all(math.isnan(q) for q in row["ratio_q1_q3"])
    assert math.isclose(row["ratio_vs_eager"], 1.05)
    assert "ratio_vs_eager" not in runs.round_stats("eager_warmup", {"eager_warmup": [1.0]})


def test_a_second_start_keeps_its_groups_caches_and_a_shared_store_gets_new_compile_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RUN_SHARES", None)  # the run set no GEMMTUNE_SHARE_KERNELS of its own
    assert runs.STEADY_GROUP["eager_warmup_patched"] == runs.FIRST["eager_warmup"][0]
    first = runs.cache_env(tmp_path, *runs.FIRST["gemmtune"])
    assert runs.cache_env(tmp_path, *runs.FIRST["gemmtune_again"]) == first
    store = runs.cache_env(tmp_path, *runs.FIRST["gemmtune_store"])
    assert store["GEMMTUNE_STORE"] == first["GEMMTUNE_STORE"]
    assert store["TRITON_CACHE_DIR"] != first["TRITON_CACHE_DIR"]
    assert store["TORCHINDUCTOR_CACHE_DIR"] != first["TORCHINDUCTOR_CACHE_DIR"]
    assert runs.cache_env(tmp_path, *runs.FIRST["eager_warmup_shared"])["GEMMTUNE_SHARE_KERNELS"] == "1"
    assert first["GEMMTUNE_SHARE_KERNELS"] == "0"
    monkeypatch.setenv("GEMMTUNE_SHARE_KERNELS", "1")  # written by an earlier variant's cache_env: not the run's
    assert runs.cache_env(tmp_path, *runs.FIRST["gemmtune"])["GEMMTUNE_SHARE_KERNELS"] == "0"
    monkeypatch.setattr(runs, "RUN_SHARES", "1")  # the run's own choice wins over the group's
    assert runs.cache_env(tmp_path, *runs.FIRST["gemmtune"])["GEMMTUNE_SHARE_KERNELS"] == "1"


def test_every_a_a_control_is_plain_eager_on_the_copy_it_is_given(monkeypatch):
    import torch
    from gemmtune.dispatch.patching import patched_modules

    def no_compile(*_a, **_k):
        raise AssertionError("an A/A control compiles nothing")
    monkeypatch.setattr(torch, "compile", no_compile)

    for variant in ("eager", "eager_copy", "eager_late"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 3))
        x = torch.randn(2, 4)
        fn, facts = runs.compiled_variant(variant, model, (x,), None)
        assert facts == {} and not patched_modules(model)  # nothing tuned, nothing patched
        assert torch.equal(fn(), model(x))


def test_an_eager_variant_runs_on_its_copies_in_turn_and_others_on_one(monkeypatch, tmp_path):
    import os

    import torch

    monkeypatch.setattr(os, "environ", os.environ.copy())  # the set-up points the caches at `tmp_path`
    monkeypatch.setattr(runs, "build", lambda name, m: (torch.nn.Sequential(torch.nn.Linear(4, 3)),
                                                        (torch.randn(2, 4),)))
    calls = []
    monkeypatch.setattr(runs, "compiled_variant",
                        lambda variant, model, inputs, _: ((lambda: calls.append((variant, id(model)))), {}))
    fns = runs.steady_variants("tiny", 1, ["eager", "default"], tmp_path, False, None, {}, copies=3)
    calls.clear()
    for _ in range(6):
        fns["eager"]()
        fns["default"]()
    eager = [model for variant, model in calls if variant == "eager"]
    assert len(set(eager)) == 3 and eager[:3] == eager[3:]  # three copies, called in turn
    assert len({model for variant, model in calls if variant == "default"}) == 1


def test_the_driver_refuses_a_variant_the_protocol_does_not_have(capsys):
    models = load_bench("models")
    with pytest.raises(SystemExit) as exc:
        models.parse_args(["--first", "default,no_such_variant", "--steady", "eager,eager_closure"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_variant, eager_closure" in err and "gemmtune_store" in err
    args = models.parse_args(["--first", "", "--steady", "eager,eager_warmup_patched,eager_copy"])
    assert args.first == [] and args.steady == ["eager", "eager_warmup_patched", "eager_copy"]
