"""bench/steady_eager_pooled.py: each round is read against the mean of that run's three plain copies in
the same round, runs of different levels pool without mixing, and a missing file exits 2."""

import json

import pytest

from helpers import load_bench

pooled_script = load_bench("steady_eager_pooled")


def write_run(path, level, ratio, rounds=9, variants=("eager_warmup",)):
    """A steady-eager run on one case: plain copies at `level` ms (eager_late 2 % above, so the reference
    is their mean), each variant `ratio` times that mean in every round."""
    plain = {"eager": level, "eager_copy": level, "eager_late": level * 1.02}
    ref = sum(plain.values()) / 3
    steady = [dict(variant=v, round_ms=[ms] * rounds) for v, ms in plain.items()]
    steady += [dict(variant=v, round_ms=[ref * ratio] * rounds) for v in variants]
    path.write_text(json.dumps({"meta": {}, "cases": [{"case": "stack:1", "first": [], "steady": steady}]}))
    return path


def test_runs_pool_against_each_runs_own_plain_copies(tmp_path):
    fast = write_run(tmp_path / "a.json", 1.0, 0.99, variants=("eager_warmup", "eager_lean"))
    slow = write_run(tmp_path / "b.json", 2.0, 0.99, rounds=5)
    table = pooled_script.pooled([fast, slow])["stack:1"]
    warm = table["eager_warmup"]
    assert warm["x_eager"] == pytest.approx(0.99) and warm["lo"] == pytest.approx(0.99)
    assert (warm["rounds"], warm["runs"]) == (14, 2)
    assert (table["eager_lean"]["rounds"], table["eager_lean"]["runs"]) == (9, 1)
    assert table["eager_late"]["x_eager"] == pytest.approx(1.02 / (3.02 / 3))


def test_cli_writes_json_and_refuses_a_missing_file(tmp_path, capsys):
    run = write_run(tmp_path / "a.json", 1.0, 1.01)
    out = tmp_path / "pooled.json"
    assert pooled_script.main([str(run), "--out", str(out)]) == 0
    assert "| stack:1 | eager_warmup | 1.0100" in capsys.readouterr().out
    assert json.loads(out.read_text())["cases"]["stack:1"]["eager_warmup"]["runs"] == 1
    assert pooled_script.main([str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
