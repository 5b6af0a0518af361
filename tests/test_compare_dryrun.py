"""bench/compare.py: importable and `--dry-run` works without a GPU."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "bench" / "shapes.json"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("gemmtune_bench_compare", ROOT / "bench" / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_prints_and_writes_the_plan(compare, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert compare.main(["--dry-run", "--suite", str(SUITE), "--out", str(out),
                         "--exhaustive", "square-2048,llama3-8b-down-m16"]) == 0
    printed = capsys.readouterr().out
    names = [s["name"] for s in json.loads(SUITE.read_text())["shapes"]]
    assert all(name in printed for name in names)
    plan = json.loads(out.read_text())["plan"]
    assert [p["name"] for p in plan] == names
    by_name = {p["name"]: p for p in plan}
    assert by_name["square-2048"]["timed"] == ["gemmtune pick", "cublas", "inductor pick", "gemmtune exhaustive pick"]
    assert by_name["square-1024"]["timed"] == ["gemmtune pick", "cublas", "inductor pick"]
    assert any("max-autotune-no-cudagraphs" in s for s in by_name["square-1024"]["steps"])


def test_dry_run_options(compare, tmp_path, capsys):
    assert compare.main(["--dry-run", "--suite", str(SUITE), "--only", "odd-1000", "--no-inductor", "--out", ""]) == 0
    printed = capsys.readouterr().out
    assert "odd-1000" in printed and "square-1024" not in printed and "inductor" not in printed
    with pytest.raises(SystemExit):
        compare.main(["--dry-run", "--suite", str(SUITE), "--exhaustive", "no-such-shape"])
    with pytest.raises(SystemExit):
        compare.main(["--dry-run", "--suite", str(SUITE), "--only", "no-such-shape"])


def fake_row(name, inductor=True):
    row = {"name": name, "problem": "mm 8x8x8 bfloat16 B=row", "cublas_ms": 0.02, "winner": "aten_mm",
           "gemmtune_ms": 0.019, "speedup_vs_cublas": 0.02 / 0.019, "gemmtune_cold_s": 3.0, "gemmtune_warm_s": 1.0,
           "n_choices": 10, "benchmark_runs": 5}
    if inductor:
        row.update(inductor_ms=0.021, inductor_speedup_vs_cublas=0.02 / 0.021, inductor_tune_s=5.0)
    return row


def test_report_table_and_plots(compare, tmp_path):
    rows = [fake_row("a"), dict(fake_row("b", inductor=False), exh_winner="x", regret_pct=0.5, exh_runs=20)]
    table = compare.markdown(rows, {"device": "H200", "torch": "t", "triton": "3.6", "date": "d"})
    assert "| a |" in table and "| b |" in table and "regret" in table
    pytest.importorskip("matplotlib")
    paths = compare.plot(rows, str(tmp_path / "cmp"))
    assert [Path(p).name for p in paths] == ["cmp_speedup.png", "cmp_tuning.png"]
    assert all(Path(p).stat().st_size > 0 for p in paths)
