"""docs/MODELS.md and README.md hold the whole-model table that bench/models_table.py renders from the
protocol runs' JSON in bench/results/ (so a number in it cannot drift from its run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("models_table", ROOT / "bench" / "models_table.py")
models_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(models_table)


@pytest.mark.parametrize("doc", ["docs/MODELS.md", "README.md"])
def test_the_docs_hold_the_table_of_the_runs(doc):
    text = (ROOT / doc).read_text()
    inside = text[text.index(models_table.BEGIN) + len(models_table.BEGIN):text.index(models_table.END)]
    assert inside.strip() == models_table.table(), f"{doc} is out of date: run python bench/models_table.py --write"


def test_each_row_is_one_run_and_its_ratios_come_from_it(tmp_path):
    run = {"cases": [{"case": "stack:1",
                      "first": [{"variant": "default", "first_s": 6.0}, {"variant": "max_autotune", "first_s": 30.0},
                                {"variant": "gemmtune", "first_s": 9.0}, {"variant": "gemmtune_store", "first_s": 7.2},
                                {"variant": "max_autotune_again", "first_s": 5.0},
                                {"variant": "gemmtune_again", "first_s": 2.0},
                                {"variant": "eager_warmup_shared_store", "first_s": 1.3}],
                      "steady": [{"variant": "default", "ratio_vs_max_autotune": 1.2},
                                 {"variant": "gemmtune", "ratio_vs_max_autotune": 0.99}]},
                     {"case": "stack:64", "first": [], "steady": []}]}
    (tmp_path / "r.json").write_text(__import__("json").dumps(run))
    lines = models_table.table(("r.json",), tmp_path).splitlines()
    assert lines[2:] == ["| stack:1 | `r.json` | 6.0 / 30.0 | 9.0 (0.30) | 7.2 (1.20) | 0.40 | 1.200 / 0.990 | - | - / - / 1.3 | - |"]


def test_every_run_the_table_cites_is_in_the_results():
    for name in models_table.RUNS:
        assert (models_table.RESULTS / name).is_file(), name


def test_the_eager_column_prefers_the_paired_ratio_and_marks_a_derived_one():
    paired = [{"variant": "eager", "ratio_vs_max_autotune": 3.0, "ratio_vs_eager": 1.0},
              {"variant": "eager_warmup", "ratio_vs_max_autotune": 2.7, "ratio_vs_eager": 1.017,
               "ratio_vs_eager_q1_q3": [1.008, 1.024]}]
    assert models_table.eager_ratio(paired) == "1.017 (1.008-1.024)"
    with_control = paired + [{"variant": "eager_copy", "ratio_vs_eager": 0.997, "ratio_vs_eager_q1_q3": [0.951, 1.021]}]
    assert models_table.eager_ratio(with_control) == "1.017 (1.008-1.024); A/A 0.997 (0.951-1.021)"
    late = with_control + [{"variant": "eager_late", "ratio_vs_eager": 1.012, "ratio_vs_eager_q1_q3": [0.99, 1.03]}]
    assert models_table.eager_ratio(late) == "1.017 (1.008-1.024); A/A 0.997 (0.951-1.021); A/A late 1.012 (0.990-1.030)"
    closure = [*paired, {"variant": "eager_closure", "ratio_vs_eager": 1.009, "ratio_vs_eager_q1_q3": [0.98, 1.02]}]
    assert models_table.eager_ratio(closure) == "1.017 (1.008-1.024); closure 1.009 (0.980-1.020)"
    derived = [{"variant": "eager", "ratio_vs_max_autotune": 3.0}, {"variant": "eager_warmup", "ratio_vs_max_autotune": 2.7}]
    assert models_table.eager_ratio(derived) == "~0.900"
    assert models_table.eager_ratio([{"variant": "gemmtune", "ratio_vs_max_autotune": 0.99}]) == "-"
