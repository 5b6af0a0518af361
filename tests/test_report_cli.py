"""The AUTOTUNE report, the JSON form and the CLI."""

import dataclasses
import json
import re

import pytest
import torch

import gemmtune
from gemmtune.cli import main
from gemmtune.core.choices import Choice, Selection, Timing, as_params
from gemmtune.core.errors import InputError
from gemmtune.core.inputs import KernelInputs
from gemmtune.report import LEGEND, LOST, STAGE_LABELS, autotune_table
from gemmtune.offline.suite import ProblemSpec, load_suite
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate

from helpers import ScriptedTemplate

ROW = re.compile(r"^  (\S+)\s+(\d+\.\d{4}) ms\s+(\d+\.\d)% (interleaved final|prescreen|final|store|pinned)\s*(.*)$")
FAILURE = re.compile(r"^  \S+( \(.*\))?: (compile failed|wrong result|run failed): ")
SUMMARY = re.compile(r"SingleProcess AUTOTUNE benchmarking takes \d+\.\d{4} seconds and \d+\.\d{4} seconds "
                     r"precompiling for (\d+) choices and \d+\.\d{4} seconds prescreening")


def _split(table: str) -> tuple[list[re.Match], list[str]]:
    """The table's rows (after the three header lines and the count line) and the paragraphs after them
    (a line wrapped to the width continues on lines indented by two spaces).

    After the rows come only the failures, notes (why a faster row lost, the timing noise), the legend
    where asked for, and the summary line."""
    lines = table.splitlines()
    assert re.match(r"\d+ choices?: \d+ timed", lines[3]), lines[3]
    lines = lines[4:]
    n = next((i for i, line in enumerate(lines) if not ROW.match(line)), len(lines))
    rows, rest = [ROW.match(line) for line in lines[:n]], []
    for line in lines[n:]:
        if line.startswith("  ") and rest and not FAILURE.match(line):
            rest[-1] += " " + line.strip()
        else:
            rest.append(line)
    if len(rest) > 1 and rest[-2] == LEGEND:  # asked for (legend=True, the CLI's -v)
        rest.pop(-2)
    assert all(line.startswith("note: ") or FAILURE.match(line) for line in rest[:-1]), rest
    return rows, rest  # type: ignore[return-value]


@pytest.fixture(scope="module")
def selection():
    a, b = torch.randn(64, 48), torch.randn(32, 48).t()
    return gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), NumpyTemplate(), ScriptedTemplate()])


def test_table_has_inductor_format(selection):
    lines = gemmtune.autotune_table(selection).splitlines()
    assert lines[0] == "AUTOTUNE mm(64x48, 48x32)"
    assert lines[1] == "strides: [48, 1], [1, 48]"
    assert lines[2] == "dtypes: torch.float32, torch.float32"
    rows, rest = _split("\n".join(lines))
    binaries = {t.choice.binary_key for t in selection.timings if t.ms is not None}
    assert len(rows) == len(binaries) == 4  # one row per binary: the scripted template's two runtime values folded in
    assert sum(bool(re.fullmatch(r"group=[12] \(best of 2\)", r.group(5))) for r in rows) == 2
    assert SUMMARY.fullmatch(rest[-1]).group(1) == "6"


def test_rows_show_stages_and_the_winner_carries_its_deciding_time():
    from gemmtune.store.sqlite import Store

    a, b, store = torch.randn(40, 24), torch.randn(24, 56), Store(":memory:")
    templates = [AtenTemplate("mm"), NumpyTemplate(), ScriptedTemplate()]
    fresh = gemmtune.tune("mm", a, b, templates=templates, store=store)
    stages = _check_rows(fresh)
    # Which stage each row's time comes from depends on the timings (a config that stage 1 leaves out
    # keeps its prescreen time; a finalist twice as slow is not re-timed interleaved).
    assert set(stages) <= {"interleaved final", "final", "prescreen"}
    warm = gemmtune.tune("mm", a, b, templates=templates, store=store)
    assert warm.cache_hit and set(_check_rows(warm)) == {"store"}


def _check_rows(selection):
    rows, _ = _split(gemmtune.autotune_table(selection))
    assert rows
    stages = [r.group(4) for r in rows]
    ms = [float(r.group(2)) for r in rows[1:]]
    assert ms == sorted(ms)  # after the winner, fastest first, whatever stage each time comes from
    (win,) = [r for r in rows if "<- winner" in r.group(5)]
    assert win == rows[0]
    deciding = next(t for t in selection.timings if t.choice == selection.winner)
    assert win.group(1) == selection.winner.name and win.group(4) == STAGE_LABELS[deciding.stage]
    assert float(win.group(2)) == pytest.approx(selection.winner_ms, abs=5e-5) and win.group(3) == "100.0"
    return stages


def _hand_selection(lib_ms, gen_ms, pre_ms):
    """A Selection as the final leaves it: the library kernel and one generated kernel re-timed
    interleaved, another generated kernel timed only in the prescreen (faster there)."""
    lib, gen, pre = Choice("aten_mm", None), Choice("gen", "h", as_params({"T": 1}), family="numba"), \
        Choice("gen", "h", as_params({"T": 2}), family="numba")
    ki = KernelInputs.from_tensors("mm", torch.ones(4, 4), torch.ones(4, 4))
    timings = (Timing(pre, pre_ms, "prescreen"), Timing(gen, gen_ms, "finalist"), Timing(lib, lib_ms, "finalist"))
    winner = lib if lib_ms <= gen_ms * 1.01 else gen
    return Selection(ki, winner, timings, None, "prescreen", 3, 0.0, 0.0, 0.0, 0.0, "cpu")


def test_the_winner_comes_first_with_its_deciding_time_and_a_faster_prescreen_row_says_why_it_lost():
    rows, notes = _split(autotune_table(_hand_selection(lib_ms=2.0, gen_ms=1.5, pre_ms=1.0)))
    assert [(r.group(1), r.group(2), r.group(4)) for r in rows] == [
        ("gen_T1", "1.5000", "interleaved final"), ("gen_T2", "1.0000", "prescreen"),
        ("aten_mm", "2.0000", "interleaved final")]  # the winner, then by time
    assert rows[0].group(5) == "<- winner" and rows[0].group(3) == "100.0"
    assert rows[1].group(3) == "150.0" and rows[1].group(5) == "lost: not re-timed"  # faster, not what decided
    assert rows[2].group(5) == "library kernel"
    assert [n for n in notes if n.startswith("note: lost: not re-timed: ")] == [
        "note: lost: not re-timed: " + LOST["not re-timed"]]


def test_a_generated_kernel_faster_than_the_library_kernel_kept_by_the_margin_says_so():
    rows, notes = _split(autotune_table(_hand_selection(lib_ms=1.005, gen_ms=1.0, pre_ms=0.9)))
    assert [(r.group(1), r.group(2), r.group(3), r.group(4), r.group(5)) for r in rows] == [
        ("aten_mm", "1.0050", "100.0", "interleaved final", "library kernel  <- winner"),
        ("gen_T2", "0.9000", "111.7", "prescreen", "lost: not re-timed"),
        ("gen_T1", "1.0000", "100.5", "interleaved final", "lost: library margin")]
    assert "note: lost: library margin: " + LOST["library margin"] in notes


def test_rows_fold_a_binarys_runtime_values_into_one_row_and_the_count_line_says_what_became_of_each_choice():
    lib, gen = Choice("aten_mm", None), Choice("gen", "h", as_params({"T": 1}), family="numba")
    runs = [dataclasses.replace(gen, runtime=as_params({"group": g})) for g in (1, 4, 8, 16)]
    ki = KernelInputs.from_tensors("mm", torch.ones(4, 4), torch.ones(4, 4))
    timings = (Timing(runs[0], 3.0, "prescreen"), Timing(runs[1], 2.5, "final"), Timing(runs[2], 2.0, "prescreen"),
               Timing(runs[3], None, "skipped", "not_benchmarked"), Timing(lib, 1.0, "finalist"),
               Timing(Choice("bad", "h", family="numba"), None, "final", "compile_failed", "out of resource"))
    sel = Selection(ki, lib, timings, None, "prescreen", 4, 0.0, 0.0, 0.0, 0.0, "cpu")
    table = autotune_table(sel)
    assert table.splitlines()[3] == "6 choices: 4 timed, in 2 rows (one per kernel); 1 pruned before timing; 1 failed"
    rows, _ = _split(table)
    # the binary's row: its latest stage's best value (the final's group=4), not a faster prescreen reading
    assert [(r.group(1), r.group(2), r.group(5)) for r in rows] == [
        ("aten_mm", "1.0000", "library kernel  <- winner"), ("gen_T1", "2.5000", "group=4 (best of 3)")]
    assert "  bad: compile failed: out of resource" in table.splitlines()


def test_json_has_every_field(selection):
    d = gemmtune.selection_dict(selection)
    for key in ("problem", "winner", "layout", "choices", "benchmark_runs", "compile_s", "benchmark_s", "tuning_s"):
        assert key in d
    assert d["layout"] == "fixed"
    assert d["winner"] in {c["name"] for c in d["choices"]}
    for c in d["choices"]:
        assert set(c) >= {"name", "template", "config", "runtime_params", "ms", "stage"}
    assert json.loads(json.dumps(d, default=str))["benchmark_runs"] == selection.benchmark_runs


def run_cli(tmp_path, *args):
    path = tmp_path / f"out{len(list(tmp_path.iterdir()))}.json"
    assert main(["tune", "--no-progress", "--json", str(path), *args]) == 0
    return json.loads(path.read_text())


def test_cli_prescreen_benchmarks_fewer_runs_than_exhaustive(tmp_path, capsys):
    common = ["--device", "cpu", "--shape", "96x64x80", "--store", "off"]
    pre = run_cli(tmp_path, *common, "--strategy", "prescreen", "--top-x", "2")
    exh = run_cli(tmp_path, *common, "--strategy", "exhaustive")
    assert pre["benchmark_runs"] < exh["benchmark_runs"]
    assert pre["layout"] == exh["layout"] == "fixed"
    assert {c["family"] for c in exh["choices"]} == {"extern", "numba"}  # the CPU default families (numpy: opt-in)
    out = capsys.readouterr().out
    assert out.count("AUTOTUNE mm(96x64, 64x80)") == 2


def test_cli_extern_only_addmm_col_layout(tmp_path):
    d = run_cli(tmp_path, "--device", "cpu", "--op", "addmm", "--shape", "33x17x9", "--b-layout", "col",
                "--backends", "extern")
    assert d["layout"] == "flexible"
    assert d["problem"]["strides"][2] == [1, 17]


def test_cli_bmm(tmp_path):
    d = run_cli(tmp_path, "--device", "cpu", "--op", "bmm", "--batch", "3", "--shape", "20x16x12")
    assert d["problem"]["batch"] == 3 and d["winner"]


def test_cli_suite_prints_summary(tmp_path, capsys):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"shapes": [
        {"name": "a", "op": "mm", "M": 32, "K": 16, "N": 24, "dtype": "float32", "b_layout": "row"},
        {"name": "b", "op": "mm", "M": 8, "K": 40, "N": 16, "dtype": "float32", "b_layout": "col"}]}))
    d = run_cli(tmp_path, "--device", "cpu", "--suite", str(suite), "--backends", "extern")
    assert [r["name"] for r in d["results"]] == ["a", "b"]
    assert "gemmtune summary" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["--shape", "12x0x3"], "positive integer"),
    (["--shape", "12x3"], "MxKxN"),
    (["--dtype", "int8"], "unsupported dtype"),
    (["--backends", "cublas"], "unknown family"),
])
def test_cli_bad_input_is_a_clear_error(args, needle, capsys):
    assert main(["tune", "--no-progress", "--device", "cpu", *args]) == 2
    assert needle in capsys.readouterr().err


def test_suite_file_of_the_public_benchmark_parses():
    from pathlib import Path

    SHAPES = Path(__file__).resolve().parents[1] / "bench" / "shapes.json"  # in the repo
    specs = load_suite(SHAPES)
    assert len(specs) >= 20 and all(s.op == "mm" for s in specs)
    a, b = ProblemSpec(4, 8, 6, b_layout="col").tensors("cpu")
    assert a.shape == (4, 8) and b.shape == (8, 6) and b.stride() == (1, 8)
    with pytest.raises(InputError):
        ProblemSpec(4, 8, 6, op="conv")


def test_table_says_when_noise_decided_the_pick():
    import dataclasses

    from gemmtune.report import autotune_table, selection_dict

    sel = gemmtune.tune("mm", torch.randn(16, 8), torch.randn(8, 4), backends=("extern",),
                        settings=gemmtune.Settings(store="off"))
    quiet = autotune_table(dataclasses.replace(sel, noisy=False, provisional=False))
    assert "timing noise" not in quiet
    loud = dataclasses.replace(sel, noisy=True, provisional=True)
    text = autotune_table(loud)
    assert "within the timing noise" in text and "stored as provisional" in text
    assert selection_dict(loud)["noisy"] is True and selection_dict(loud)["provisional"] is True


def test_the_legend_comes_only_when_asked_for(selection):
    assert LEGEND not in gemmtune.autotune_table(selection)
    table = gemmtune.autotune_table(selection, legend=True, width=1000)
    assert table.splitlines()[-2] == LEGEND
