"""The fp8 slice of the shipped sweep data (`gemmtune/data/sweep_h200_fp8.jsonl.gz`: the Llama-3-8B
projections of the fp8 suite at M = 16 and 128, tensor-wise and row-wise, on an H200) replayed by
`gemmtune simulate`, as the CLI does it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemmtune.cli import main
from gemmtune.offline.dataset import read_lines
from gemmtune.offline.simulate import by_op, load
from gemmtune.offline.suite import ProblemSpec
from gemmtune.offline.sweep import problem_fields

PRESCREEN = "prescreen[x=5,swizzle=4]"

DATA = Path(__file__).resolve().parents[1] / "src" / "gemmtune" / "data"  # shipped with the package
SLICE = DATA / "sweep_h200_fp8.jsonl.gz"


@pytest.fixture(scope="module")
def report(replay_slice):
    return replay_slice(SLICE, ["default", "exhaustive", PRESCREEN])


def test_the_slice_is_the_16_fp8_problems_each_with_cublaslt_and_the_triton_template(report):
    shapes, _ = report
    assert len(shapes) == 16
    assert {s.op for s in shapes} == {"scaled_mm"}
    assert {s.shape[0] for s in shapes} == {16, 128}
    for s in shapes:
        uids = {c.template_uid for c in s.times}
        assert {"aten_scaled_mm", "triton_scaled_mm"} <= uids, (s.name, uids)
        assert len(s.times) >= 185, s.name


def test_each_record_rebuilds_its_problem_and_the_keys_are_sixteen_problems():
    recs = [r for r in read_lines(SLICE) if r.get("type") == "shape"]
    assert {r["scales"] for r in recs} == {"tensorwise", "rowwise"}
    assert len({r["problem_key"] for r in recs}) == 16
    for rec in recs:
        spec = ProblemSpec.from_record(rec)
        assert problem_fields(spec) == {k: rec[k] for k in problem_fields(spec)}
        assert (spec.op, spec.out_dtype, spec.fast_accum) == ("scaled_mm", "bfloat16", False)


def test_the_triton_template_is_the_fastest_kernel_on_some_row_wise_problem(report):
    shapes, _ = report
    best = {s.name: min(s.times, key=s.times.__getitem__).template_uid for s in shapes}
    assert any(uid == "triton_scaled_mm" for name, uid in best.items() if name.endswith("rowwise")), best


def test_prescreen_meets_the_regret_target_and_the_default_stays_within_one_percent(report):
    _, rep = report
    prescreen, default = rep[PRESCREEN], rep["default"]
    assert prescreen.max_regret_pct <= 0.5 and prescreen.work_fraction <= 0.30
    assert default.max_regret_pct <= 1.0 and default.work_fraction <= 0.10
    assert rep["exhaustive"].max_regret_pct == 0.0


def test_gemmtune_simulate_replays_the_slice_as_fp8_from_the_cli(tmp_path):
    out = tmp_path / "sim.json"
    assert main(["simulate", "--dataset", str(SLICE), "--op", "scaled_mm", "--strategy", "default",
                 "--json", str(out)]) == 0
    rows = {s["name"]: s for s in json.loads(out.read_text())["strategies"]}
    assert len(rows["default"]["per_shape"]) == 16
    shapes, dims = load(SLICE)
    assert list(by_op(shapes, dims)) == ["scaled_mm"]
