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
    assert any("installed()" in s and "misaligned" in s for s in by_name["square-1024"]["steps"])


def test_the_compiled_path_is_planned_as_asked(compare, tmp_path):
    out = tmp_path / "plan.json"
    for which, expect in (("off", None), ("all", "fresh caches"), ("misaligned", "if a dimension is misaligned")):
        assert compare.main(["--dry-run", "--suite", str(SUITE), "--only", "odd-1000", "--compiled", which,
                             "--out", str(out)]) == 0
        steps = [s for s in json.loads(out.read_text())["plan"][0]["steps"] if s.startswith("gemmtune compiled")]
        assert (steps == []) if expect is None else (len(steps) == 1 and steps[0].endswith(expect))
    with pytest.raises(SystemExit):
        compare.main(["--dry-run", "--suite", str(SUITE), "--compiled", "sometimes"])


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


def test_the_report_table_has_a_row_per_shape_and_the_regret_of_the_exhaustive_ones(compare):
    rows = [fake_row("a"), dict(fake_row("b", inductor=False), exh_winner="x", regret_pct=0.5, exh_runs=20)]
    table = compare.markdown(rows, {"device": "H200", "torch": "t", "triton": "3.6", "date": "d"})
    assert "| a |" in table and "| b |" in table and "| b | `aten_mm` | `x` | 0.50 | 5 | 20 |" in table
    assert "| a | mm 8x8x8 bfloat16 B=row | 0.0200 | `aten_mm` | 0.0190 | 1.053 | 0.0210 | 0.952 |" in table


def test_parts_cover_the_suite_once(compare, tmp_path):
    names = []
    for k in (1, 2, 3):
        out = tmp_path / f"p{k}.json"
        assert compare.main(["--dry-run", "--suite", str(SUITE), "--part", f"{k}/3", "--out", str(out)]) == 0
        names += [p["name"] for p in json.loads(out.read_text())["plan"]]
    assert names == [s["name"] for s in json.loads(SUITE.read_text())["shapes"]]
    with pytest.raises(SystemExit, match="--part"):
        compare.main(["--dry-run", "--suite", str(SUITE), "--part", "3/2"])


def test_merge_orders_rows_and_computes_the_targets(compare, tmp_path, capsys):
    slow = dict(fake_row("square-2048"), gemmtune_ms=0.0215, speedup_vs_cublas=0.02 / 0.0215,
                exhaustive_ms=0.018, exh_winner="t", regret_pct=19.4, exh_runs=50,
                exh_best_template="t", exh_best_template_ms=0.018, exh_library_ms=0.02)
    meta = {"device": "H200", "torch": "t", "triton": "3.6", "date": "d", "command": "c"}
    (tmp_path / "b.json").write_text(json.dumps({"meta": meta, "rows": [slow]}))
    (tmp_path / "a.json").write_text(json.dumps({"meta": meta, "rows": [fake_row("square-1024")]}))
    out = tmp_path / "all.json"
    assert compare.main(["--suite", str(SUITE), "--merge", str(tmp_path / "b.json"), str(tmp_path / "a.json"),
                         "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["name"] for r in data["rows"]] == ["square-1024", "square-2048"]  # the suite's order
    s = data["summary"]
    assert s["within_1pct_of_best"] == 0.5 and s["over_1_02_cublas"] == ["square-2048"]
    assert s["cold_vs_inductor"] == pytest.approx(3.0 / 5.0)
    assert s["best_template_vs_library"]["square-2048"] == pytest.approx(0.02 / 0.018)
    assert "| square-2048 |" in capsys.readouterr().out


def test_the_summary_compares_the_compiled_path_and_never_flags_the_library_kernel_against_itself(compare):
    lib = dict(fake_row("lib"), pick_is_library=True, gemmtune_second_ms=0.0210, cublas_second_ms=0.0200)
    gen = dict(fake_row("gen"), pick_is_library=False, gemmtune_second_ms=0.0210, cublas_second_ms=0.0200,
               misaligned=True, compiled_ms=0.020)
    s = compare.summary([lib, gen])
    assert s["over_1_02_cublas_second"] == ["gen"]  # 5 % slower under the second timer; "lib" is cuBLAS itself
    assert s["misaligned_vs_inductor"] == {"gen": pytest.approx(0.021 / 0.019)}
    assert s["compiled_vs_inductor"] == {"gen": pytest.approx(0.021 / 0.020)}


def test_dry_run_of_the_fp8_suite_names_the_library_call_and_the_scales(compare, tmp_path, capsys):
    out = tmp_path / "plan.json"
    only = "llama3-8b-q_o-m16-tensorwise,llama3-8b-q_o-m16-rowwise"
    assert compare.main(["--dry-run", "--suite", str(ROOT / "bench" / "shapes_fp8.json"), "--only", only,
                         "--out", str(out)]) == 0
    plan = json.loads(out.read_text())["plan"]
    assert [(p["op"], p["scales"], p["dtype"]) for p in plan] == [("scaled_mm", "tensorwise", "float8_e4m3fn"),
                                                                   ("scaled_mm", "rowwise", "float8_e4m3fn")]
    assert all("torch._scaled_mm" in p["steps"][0] for p in plan)
    assert "scaled_mm 16x4096x4096 float8_e4m3fn rowwise" in capsys.readouterr().out


def test_a_shape_times_the_compiled_path_where_it_is_asked_for(compare, monkeypatch):
    """run_shape on the CPU with stand-ins for the compiles and the timers: the compiled path runs and is
    timed on a misaligned shape under "misaligned" and "all", on an aligned one only under "all"."""
    import types

    import torch

    from gemmtune.core.settings import Settings
    from gemmtune.offline.suite import ProblemSpec

    compiles = []
    monkeypatch.setattr(compare, "run_compiled", lambda spec, tensors, settings=None: (
        compiles.append("gemmtune" if settings else "inductor") or (lambda *t: t[0] @ t[1]), 0.1,
        "triton_mm_1 (BLOCK_M=64) 0.1 ms"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(ProblemSpec, "tensors", lambda self, device: (torch.randn(self.M, self.K),
                                                                     torch.randn(self.K, self.N)))
    import gemmtune.measure.second as second
    monkeypatch.setattr(second, "second_reading", lambda fns, timer, device, rounds: [1.0] * len(fns))
    monkeypatch.setattr(second, "second_timer_for", lambda flush: "do_bench")
    timer = types.SimpleNamespace(flush="write", device="cpu", time_interleaved=lambda fns, rounds: [
        types.SimpleNamespace(cost_ms=1.0, host_ms=1.0) for f in fns if f() is not None])
    settings = Settings(store="off", backends=("extern",))
    for k, which, runs in ((7, "misaligned", True), (8, "misaligned", False), (8, "all", True), (7, "off", False)):
        compiles.clear()
        spec = ProblemSpec(name="s", op="mm", M=8, K=k, N=8, dtype="float32")  # K = 7: A's rows misaligned
        row = compare.run_shape(spec, settings, timer, False, True, 2, which)
        assert compiles == (["inductor", "gemmtune"] if runs else ["inductor"]), (k, which)
        assert ("compiled_ms" in row) == runs and row["inductor_ms"] == 1.0
        assert row["inductor_pick"].startswith("triton_mm_1")


@pytest.mark.parametrize("col", [True, False])
def test_the_padded_view_holds_b_as_a_frozen_layers_weight(compare, col):
    # A patched head under no_grad: B (W.t() or a row-major [K, N]) is a view of a Parameter that needs no grad,
    # so the padded twin keeps its padded copy (templates/padded.py, _ParameterPads), as in a model.
    import torch
    a, w = torch.randn(6, 8), torch.randn(19, 8)
    b = w.t() if col else w.t().contiguous()
    held = compare.as_weight((torch.randn(19), a, b))
    assert held[0].shape == (19,) and held[1] is a
    weight = held[2] if not col else held[2]._base
    assert isinstance(weight, torch.nn.Parameter) and not weight.requires_grad
    assert held[2].stride() == b.stride() and torch.equal(held[2], b)
