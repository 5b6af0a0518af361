"""The CUTLASS slice of the shipped sweep data (`gemmtune/data/sweep_h200_bf16_cutlass_operators.jsonl.gz`:
7 suite shapes on an H200, cuBLAS, the operators library's shortlist and the CuTe DSL template's space)
replayed by `gemmtune simulate`, as the CLI does it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemmtune.cli import main

DATA = Path(__file__).resolve().parents[1] / "src" / "gemmtune" / "data"  # shipped with the package
SLICE = DATA / "sweep_h200_bf16_cutlass_operators.jsonl.gz"


@pytest.fixture(scope="module")
def report(replay_slice):
    return replay_slice(SLICE, ["default", "exhaustive"])


def test_the_slice_holds_both_cutlass_templates_and_the_library_on_every_shape(report):
    shapes, _ = report
    assert len(shapes) == 7
    for s in shapes:
        uids = {c.template_uid for c in s.times}
        assert {"aten_mm", "cutlass_operators", "cutlass_hopper"} <= uids, (s.name, uids)


def test_the_operators_library_is_the_best_kernel_on_some_shape_and_the_dsl_template_on_none(report):
    shapes, _ = report
    best = {s.name: min(s.times, key=s.times.__getitem__).template_uid for s in shapes}
    assert "cutlass_operators" in best.values()
    assert "cutlass_hopper" not in best.values()


def test_the_default_search_matches_exhaustive_at_under_a_third_of_its_runs(report):
    _, rep = report
    default, exhaustive = rep["default"], rep["exhaustive"]
    for d, e in zip(default.per_shape, exhaustive.per_shape):
        assert d.regret_pct <= e.regret_pct + 0.5, (d.name, d.regret_pct, e.regret_pct)
    assert default.work_fraction <= 0.30


def test_gemmtune_simulate_replays_the_slice_from_the_cli(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["simulate", "--dataset", str(SLICE), "--strategy", "default", "--json", str(out)]) == 0
    rows = {s["name"]: s for s in json.loads(out.read_text())["strategies"]}
    assert rows["default"]["work_fraction"] <= 0.30
