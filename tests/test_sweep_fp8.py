"""`gemmtune sweep` and `gemmtune simulate` on scaled_mm (fp8) problems: the records, resuming, the
problem key's round trip, the replay keyed apart from bf16 rows, and the CLI's bad input.

Real kernels on CPU: `torch._scaled_mm` and `triton_scaled_mm` through Triton's interpreter, with a
two-config space on 32x64x48 problems (tests/test_triton_interp_fp8.py checks every config there)."""

import json
import os

import pytest
import torch

from gemmtune.cli import main
from gemmtune.core.settings import Settings
from gemmtune.offline import sweep as sweep_mod
from gemmtune.offline.simulate import load, simulate_main
from gemmtune.offline.suite import ProblemSpec, load_suite
from gemmtune.offline.sweep import sweep
from gemmtune.search import ProblemDims
from gemmtune.templates.extern import AtenScaledMMTemplate

SMALL = [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, num_stages=2, num_warps=4),
         dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, num_stages=2, num_warps=4)]
FP8 = dict(op="scaled_mm", dtype="float8_e4m3fn", b_layout="col")
TINY = [ProblemSpec(32, 64, 48, scales=kind, name=f"tiny-{kind}", **FP8) for kind in ("tensorwise", "rowwise")]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_suite(tmp_path, shapes, name="suite.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"shapes": shapes}))
    return path


# -- a sweep with the backends that run on CPU, interrupted and resumed, then replayed ---------------

def interpreted_pool():
    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("the Triton template runs on CPU through its interpreter only")
    from gemmtune.templates.triton.scaled_mm import TritonScaledMMTemplate

    return [AtenScaledMMTemplate(), TritonScaledMMTemplate(space=SMALL)]


def fp8_sweep(out, log, **kw):
    settings = Settings(backends="extern,triton", cpu_rep_ms=1.0, min_reps=1, isolation="off")
    return sweep(TINY, out, "cpu", settings, log=log, templates=interpreted_pool(), **kw)


def test_an_interrupted_fp8_sweep_resumes_and_simulate_replays_it(tmp_path, monkeypatch, capsys):
    out, said = tmp_path / "fp8.jsonl", []
    real_tune, calls = sweep_mod.tune, []

    def interrupted(*args, **kw):  # Ctrl-C while the second shape is tuned
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_tune(*args, **kw)

    monkeypatch.setattr(sweep_mod, "tune", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fp8_sweep(out, said.append)
    assert [r["name"] for r in lines(out)[1:]] == ["tiny-tensorwise"]
    monkeypatch.setattr(sweep_mod, "tune", real_tune)
    assert fp8_sweep(out, said.append) == 1
    assert "tiny-tensorwise: already recorded, skipped" in said
    recs = lines(out)
    assert [r["type"] for r in recs] == ["meta", "shape", "shape"]
    for rec, spec in zip(recs[1:], TINY):
        check_record(rec, spec)
    check_replay(out, tmp_path, capsys)


def check_record(rec, spec):
    """Every choice of the pool timed and correct; the fields that key the problem; the drift marker."""
    assert (rec["op"], rec["scales"], rec["out_dtype"], rec["fast_accum"]) == ("scaled_mm", spec.scales,
                                                                                "bfloat16", False)
    assert rec["drift"]["library"] == "torch._scaled_mm" and rec["drift"]["start_ms"] > 0
    by_template = {}
    for c in rec["choices"]:
        by_template.setdefault(c["template"], []).append(c)
        assert c["status"] == "ok" and c["ms"] > 0, c
    assert sorted(by_template) == ["aten_scaled_mm", "triton_scaled_mm"]
    assert len(by_template["triton_scaled_mm"]) == len(SMALL) * 4  # every config x swizzle {1, 2, 4, 8}
    rebuilt = ProblemSpec.from_record(rec)  # the record's fields give back the problem and its key
    assert rebuilt == spec
    assert rebuilt.kernel_inputs(rebuilt.tensors("cpu")).problem_key == rec["problem_key"]


def check_replay(out, tmp_path, capsys):
    shapes, dims = load(out)
    assert [d.dtype_bytes for d in dims] == [1, 1]  # fp8's one-byte elements, as tune gives its cost model
    assert all(s.op == "scaled_mm" and s.problem.startswith("scaled_mm(32x64, 64x48, ") for s in shapes)
    report = tmp_path / "sim.json"
    assert simulate_main(["--dataset", str(out), "--no-library", "--json", str(report),
                          "--strategy", "exhaustive", "prescreen[x=1,swizzle=8]", "default"]) == 0
    assert "2 shapes (scaled_mm)" in capsys.readouterr().out
    runs = {s["name"]: s for s in json.loads(report.read_text())["strategies"]}
    assert runs["exhaustive"]["max_regret_pct"] == 0.0 and runs["exhaustive"]["work_fraction"] == 1.0
    assert runs["exhaustive"]["benchmark_runs"] == 2 * len(SMALL) * 4
    pre = runs["prescreen[x=1,swizzle=8]"]  # one config at the stage-1 swizzle, then the best one's swizzles
    assert pre["benchmark_runs"] == 2 * (len(SMALL) + 3) and 0.0 <= pre["max_regret_pct"] < 1e3
    for s in runs.values():
        assert all(r["winner"].startswith("triton_scaled_mm") for r in s["per_shape"])


# -- the command line -------------------------------------------------------------------------------

def test_the_cli_sweeps_an_fp8_suite_with_its_out_dtype_and_fast_accum(tmp_path, capsys):
    """On CPU's own families, torch._scaled_mm is the lone candidate (recorded, not timed)."""
    shapes = [{"name": "exact", "M": 16, "K": 32, "N": 16, **FP8, "scales": "tensorwise"},
              {"name": "fast", "M": 16, "K": 32, "N": 16, **FP8, "scales": "tensorwise", "out_dtype": "float32",
               "fast_accum": True},
              {"name": "bf16", "op": "mm", "M": 16, "K": 32, "N": 16, "dtype": "bfloat16"}]
    suite, out = write_suite(tmp_path, shapes), tmp_path / "d.jsonl"
    assert main(["sweep", "--suite", str(suite), "--out", str(out), "--device", "cpu"]) == 0
    recs = {r["name"]: r for r in lines(out)[1:]}
    assert (recs["exact"]["out_dtype"], recs["exact"]["fast_accum"]) == ("bfloat16", False)
    assert (recs["fast"]["out_dtype"], recs["fast"]["fast_accum"]) == ("float32", True)
    assert "scaled_mm(16x32, 32x16, tensorwise, float32, fast_accum)" in recs["fast"]["problem_key"]
    assert "scales" not in recs["bf16"] and recs["bf16"]["drift"]["library"] == "torch.mm"
    assert len({r["problem_key"] for r in recs.values()}) == 3
    for spec, rec in zip(load_suite(suite), recs.values()):
        assert ProblemSpec.from_record(rec) == spec
        assert spec.kernel_inputs(spec.tensors("cpu")).problem_key == rec["problem_key"]
    assert main(["sweep", "--suite", str(suite), "--out", str(out), "--device", "cpu"]) == 0
    assert "recorded 0 new shapes" in capsys.readouterr().out
    assert simulate_main(["--dataset", str(out)]) == 2  # lone candidates, untimed: nothing to replay
    assert "no shape with a correct timing" in capsys.readouterr().err


def test_tune_suite_tunes_a_shape_with_its_out_dtype_and_fast_accum(tmp_path, capsys):
    shape = {"M": 16, "K": 32, "N": 16, **FP8, "scales": "tensorwise", "out_dtype": "float32", "fast_accum": True}
    suite = write_suite(tmp_path, [shape])
    assert main(["tune", "--suite", str(suite), "--no-progress", "--store", "memory", "--device", "cpu"]) == 0
    assert "scaled_mm(16x32, 32x16, tensorwise, float32, fast_accum)" in capsys.readouterr().out


@pytest.mark.parametrize("suite_shape, extra, needle", [
    ({"scales": "rowwise"}, ["--dtype", "bfloat16"], "scaled_mm needs an fp8 dtype"),
    ({"op": "mm", "dtype": "float32", "b_layout": "row"}, ["--dtype", "float8_e4m3fn"], "use op scaled_mm"),
    ({}, ["--scales", "rowwise"], "unrecognized arguments: --scales rowwise"),
    ({"scales": "blockwise"}, [], "scales: expected one of tensorwise, rowwise"),
    ({"scales": "rowwise", "out_dtype": "float32"}, [], "row-wise scales need out_dtype bfloat16"),
    ({"scales": "tensorwise", "out_dtype": "float8_e4m3fn"}, [], "does not tune float8 outputs"),
    ({"scales": "tensorwise", "fast_accum": "yes"}, [], "fast_accum: expected true or false"),
    ({"op": "mm", "dtype": "float32", "b_layout": "row", "fast_accum": True}, [], "belongs to op scaled_mm"),
    ({"scales": "tensorwise", "K": 24}, [], "multiples of 16"),
])
def test_bad_fp8_sweep_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, suite_shape, extra, needle):
    shape = {"name": "s", "M": 16, "K": 32, "N": 16, **FP8, **suite_shape}
    out = tmp_path / "d.jsonl"
    assert main(["sweep", "--suite", str(write_suite(tmp_path, [shape])), "--out", str(out), "--device", "cpu",
                 *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_tune_shape_takes_scaled_mms_out_dtype_and_fast_accum(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path))
    assert main(["tune", "--op", "scaled_mm", "--shape", "16x32x16", "--out-dtype", "float32", "--fast-accum",
                 "--store", "off", "--device", "cpu"]) == 0
    assert "AUTOTUNE scaled_mm(16x32, 32x16, tensorwise, float32, fast_accum)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["--op", "mm", "--shape", "16x32x16", "--out-dtype", "float32"], "belongs to op scaled_mm"),
    (["--op", "scaled_mm", "--shape", "16x32x16", "--scales", "rowwise", "--out-dtype", "float16"],
     "row-wise scales need out_dtype bfloat16"),
    (["--suite", "SUITE", "--fast-accum"], "argument --fast-accum: a suite gives each shape's own"),
    (["--suite", "SUITE", "--out-dtype", "float32"], "argument --out-dtype: a suite gives each shape's own"),
])
def test_tune_refuses_out_dtype_and_fast_accum_where_they_do_not_belong(tmp_path, capsys, argv, needle):
    suite = write_suite(tmp_path, [{"name": "s", "M": 16, "K": 32, "N": 16, **FP8, "scales": "tensorwise"}])
    assert main(["tune", *[str(suite) if a == "SUITE" else a for a in argv], "--store", "off", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


# -- simulate keys fp8 rows apart from bf16 rows -----------------------------------------------------

def choice(template, ms, family, block=None, swizzle=None):
    cfg = {} if block is None else dict(BLOCK_M=block, BLOCK_N=block, BLOCK_K=64, num_stages=3, num_warps=4)
    return {"template": template, "src_hash": None if family == "extern" else "h", "family": family, "config": cfg,
            "runtime_params": {} if swizzle is None else {"swizzle": swizzle}, "ms": ms, "status": "ok",
            "compile_s": None if family == "extern" else 1.0}


def hand_written(path):
    """The same 64x64x64 named "p" twice: a bf16 mm and an fp8 scaled_mm, each with its own times (and one
    more, "lone", with nothing timed).  The fp8
    row's best template is config 64 at swizzle 1 (0.50 ms); at the stage-1 swizzle 8, config 128 looks
    better (0.58 < 0.60), so prescreen with one config keeps 128 and picks 128 at swizzle 1 (0.55 ms)."""
    fp8 = [choice("aten_scaled_mm", 1.0, "extern"), choice("triton_scaled_mm", 0.50, "triton", 64, 1),
           choice("triton_scaled_mm", 0.60, "triton", 64, 8), choice("triton_scaled_mm", 0.55, "triton", 128, 1),
           choice("triton_scaled_mm", 0.58, "triton", 128, 8)]
    bf16 = [choice("aten_mm", 2.0, "extern"), choice("triton_mm", 1.2, "triton", 64, 1),
            choice("triton_mm", 1.0, "triton", 64, 8)]
    shape = {"type": "shape", "name": "p", "M": 64, "K": 64, "N": 64, "batch": 1}
    recs = [{"type": "meta", "format": "gemmtune-dataset/1"},
            {**shape, "op": "mm", "dtype": "bfloat16", "b_layout": "row", "choices": bf16},
            {**shape, "op": "scaled_mm", "dtype": "float8_e4m3fn", "b_layout": "col", "scales": "rowwise",
             "out_dtype": "bfloat16", "fast_accum": False, "choices": fp8},
            {**shape, "name": "lone", "op": "mm", "dtype": "bfloat16", "b_layout": "row",  # a lone untimed candidate
             "choices": [{**choice("aten_mm", None, "extern"), "status": "ok"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_simulate_keeps_fp8_and_bf16_rows_of_the_same_shape_apart(tmp_path, capsys):
    data = hand_written(tmp_path / "mixed.jsonl")
    shapes, dims = load(data)
    assert [s.op for s in shapes] == ["mm", "scaled_mm", "mm"] and len({s.problem for s in shapes[:2]}) == 2
    assert dims[:2] == [ProblemDims(64, 64, 64, 1, 2), ProblemDims(64, 64, 64, 1, 1)]
    assert {c.template_uid for c in shapes[1].choices} == {"aten_scaled_mm", "triton_scaled_mm"}
    report, names = tmp_path / "r.json", ["exhaustive", "prescreen[x=1,swizzle=8]"]
    assert simulate_main(["--dataset", str(data), "--no-library", "--json", str(report), "--strategy", *names]) == 0
    printed = capsys.readouterr().out
    assert "1 shapes (mm)" in printed and "1 shapes (scaled_mm)" in printed
    assert "left out 1 shapes with no correct timing: lone" in printed
    ops = json.loads(report.read_text())["ops"]
    assert list(ops) == ["mm", "scaled_mm"]
    fp8 = {s["name"]: s["per_shape"] for s in ops["scaled_mm"]["strategies"]}
    assert [r["problem"] for r in fp8["exhaustive"]] == ["scaled_mm 64x64x64 float8_e4m3fn rowwise B=col"]
    assert fp8["exhaustive"][0]["regret_pct"] == 0.0
    assert fp8["prescreen[x=1,swizzle=8]"][0]["regret_pct"] == pytest.approx(10.0)  # 0.55 against 0.50
    assert fp8["prescreen[x=1,swizzle=8]"][0]["winner"].startswith("triton_scaled_mm")
    bf16 = {s["name"]: s["per_shape"] for s in ops["mm"]["strategies"]}
    assert bf16["prescreen[x=1,swizzle=8]"][0]["regret_pct"] == 0.0 and bf16["exhaustive"][0]["benchmark_runs"] == 2


def test_simulate_op_replays_one_op_and_names_what_the_data_holds(tmp_path, capsys):
    data = hand_written(tmp_path / "mixed.jsonl")
    report = tmp_path / "r.json"
    assert simulate_main(["--dataset", str(data), "--op", "scaled_mm", "--strategy", "exhaustive",
                          "--json", str(report)]) == 0
    (strategy,) = json.loads(report.read_text())["strategies"]
    assert [r["problem"].split()[0] for r in strategy["per_shape"]] == ["scaled_mm"]
    capsys.readouterr()
    assert simulate_main(["--dataset", str(data), "--op", "bmm"]) == 2
    err = capsys.readouterr().err
    assert "holds no timed bmm shape (it holds mm, scaled_mm)" in err and err.count("\n") == 1
