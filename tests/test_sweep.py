"""`gemmtune sweep`: the dataset it writes, resuming, and reading it back."""

import json

from gemmtune.cli import main
from gemmtune.offline.dataset import FORMAT, load_dataset
from gemmtune.measure.bench import Bench
from gemmtune.offline.replay import replay
from gemmtune.search import ExhaustiveOptions


def suite(tmp_path):
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"shapes": [
        {"name": "a", "op": "mm", "M": 40, "K": 24, "N": 32, "dtype": "float32", "b_layout": "row"},
        {"name": "b", "op": "mm", "M": 24, "K": 40, "N": 16, "dtype": "float32", "b_layout": "col"}]}))
    return path


def test_sweep_records_every_choice_and_resumes(tmp_path, capsys):
    out = tmp_path / "ds.jsonl"
    assert main(["sweep", "--suite", str(suite(tmp_path)), "--out", str(out), "--device", "cpu", "--only", "a"]) == 0
    assert main(["sweep", "--suite", str(suite(tmp_path)), "--out", str(out), "--device", "cpu"]) == 0
    assert "a: already recorded, skipped" in capsys.readouterr().out
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["type"] for r in lines] == ["meta", "shape", "shape"]
    assert lines[0]["format"] == FORMAT and lines[0]["timer"]["statistic"] == "median"
    for rec in lines[1:]:
        fams = {c["family"] for c in rec["choices"]}
        assert fams == {"extern", "numba"}  # the CPU default families (numpy: opt-in)
        assert all(c["ms"] is not None for c in rec["choices"])
        numba = [c for c in rec["choices"] if c["family"] == "numba"]
        assert {c["runtime_params"]["group"] for c in numba} == {1, 4, 16}
        assert rec["drift"]["start_ms"] > 0 and rec["drift"]["end_ms"] > 0
    meta, shapes = load_dataset(out)
    assert [s.name for s in shapes] == ["a", "b"]
    for s in shapes:
        assert replay(s, "exhaustive", ExhaustiveOptions()).regret_pct == 0.0


def test_sweep_backends_sweeps_only_those_families(tmp_path, capsys):
    out = tmp_path / "lib.jsonl"
    assert main(["sweep", "--suite", str(suite(tmp_path)), "--out", str(out), "--device", "cpu", "--only", "a",
                 "--backends", "extern,numpy"]) == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()][1:]
    assert {c["family"] for c in rec["choices"]} == {"extern", "numpy"}
    assert main(["sweep", "--suite", str(suite(tmp_path)), "--out", str(out), "--device", "cpu",
                 "--backends", "cublas"]) == 2
    assert "unknown family" in capsys.readouterr().err


def test_reference_sweep_is_imported(sweep_path):
    meta, shapes = load_dataset(sweep_path)
    assert meta["format"] == "reference-sweep" and len(shapes) == 6
    s = shapes[0]
    assert s.shape == (2048, 2048, 2048)
    assert any(c.template_uid == "aten_mm" for c in s.times)
    assert {c.runtime_dict["swizzle"] for c in s.times if not c.is_extern} == {1, 2, 4, 8}
    assert len(s.compile_s) == len({c.binary_key for c in s.times if not c.is_extern})


def test_a_sweep_of_a_lone_untimed_candidate_records_it(tmp_path, capsys):
    """`--backends extern` on CPU pools aten alone: nothing to compare, nothing timed, no crash."""
    out = tmp_path / "aten.jsonl"
    assert main(["sweep", "--suite", str(suite(tmp_path)), "--out", str(out), "--device", "cpu", "--only", "a",
                 "--backends", "extern"]) == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()][1:]
    assert [c["template"] for c in rec["choices"]] == ["aten_mm"]
    assert "best aten_mm untimed" in capsys.readouterr().out


def test_a_last_line_cut_short_by_a_kill_is_dropped_and_its_shape_recorded_again(tmp_path, capsys):
    out = tmp_path / "torn.jsonl"
    args = ["sweep", "--suite", str(suite(tmp_path)), "--out", str(out), "--device", "cpu", "--backends", "extern"]
    assert main(args) == 0
    whole = out.read_text()
    out.write_text(whole[: whole.rindex("\n", 0, len(whole) - 1) + 40])  # the last record torn after 39 characters
    capsys.readouterr()
    assert main(args) == 0
    printed = " ".join(capsys.readouterr().out.split())  # lines wrap at the width of the output
    assert "dropped a last line cut short" in printed and "a: already recorded, skipped" in printed
    assert "recorded 1 new shapes" in printed
    assert [json.loads(line)["name"] for line in out.read_text().splitlines()[1:]] == ["a", "b"]


def test_sweep_rounds_re_times_the_choices_interleaved_and_records_their_spread(tmp_path, capsys, monkeypatch):
    # Which CPU choices the re-time takes depends on their times (those within 2x of the fastest,
    # `Bench._worth_retiming`); here it takes every one, as on a GPU, so the test does not hang on timings.
    asked = []
    monkeypatch.setattr(Bench, "_worth_retiming", lambda self, choices: asked.append(len(choices)) or list(choices))
    out = tmp_path / "r.jsonl"
    assert main(["sweep", "--suite", str(suite(tmp_path)), "--out", str(out), "--device", "cpu", "--only", "a",
                 "--backends", "extern,numpy", "--rounds", "5"]) == 0
    meta, rec = [json.loads(line) for line in out.read_text().splitlines()]
    assert meta["timer"]["rounds"] == 5
    timed = [c for c in rec["choices"] if c["ms"] is not None]
    assert len(timed) == 2 and asked == [2]  # every correct choice reached the interleaved re-time
    assert all(c["interleaved"] and c["spread"] is not None and c["spread"] >= 0.0 for c in timed)
    _, shapes = load_dataset(out)
    assert replay(shapes[0], "exhaustive", ExhaustiveOptions()).regret_pct == 0.0


def test_a_plain_sweep_keeps_each_choices_own_timing_but_the_finals(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert main(["sweep", "--suite", str(suite(tmp_path)), "--out", str(out), "--device", "cpu", "--only", "a"]) == 0
    meta, rec = [json.loads(line) for line in out.read_text().splitlines()]
    assert meta["timer"]["rounds"] == 0
    again = [c for c in rec["choices"] if c["interleaved"]]
    assert len(again) <= 2 < len(rec["choices"])  # the final's own: the pick and the library kernel at most


def test_sweep_rounds_refuses_a_negative_count(tmp_path, capsys):
    assert main(["sweep", "--suite", str(suite(tmp_path)), "--out", str(tmp_path / "n.jsonl"), "--device", "cpu",
                 "--rounds", "-1"]) == 2
    assert "--rounds" in capsys.readouterr().err
