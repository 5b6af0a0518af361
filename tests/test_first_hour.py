"""A newcomer's first hour on CPU: the documented commands, run end to end as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path) -> dict[str, str]:
    """A store of the test's own; numba's compiled kernels stay in the usual cache (warm after a first run)."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GEMMTUNE_STORE": str(tmp_path / "store.sqlite")}


def _gemmtune(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gemmtune", *args], capture_output=True, text=True,
                          env=_env(tmp_path), timeout=300)


def _tiny_suite(tmp_path: Path) -> str:
    """bench/shapes.json's format: a float32 shape and a bfloat16 one (a single untimed candidate on CPU)."""
    shapes = [{"name": "tiny-f32", "op": "mm", "M": 32, "K": 32, "N": 32, "dtype": "float32", "b_layout": "row"},
              {"name": "tiny-bf16", "op": "mm", "M": 32, "K": 32, "N": 32, "dtype": "bfloat16", "b_layout": "col"}]
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"shapes": shapes}))
    return str(path)


def test_documented_suite_command_prints_the_summary_with_an_untimed_bf16_winner(tmp_path):
    suite, out_json = _tiny_suite(tmp_path), str(tmp_path / "sel.json")
    run = _gemmtune(tmp_path, "tune", "--suite", suite, "--device", "cpu", "--json", out_json)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "error" not in run.stderr
    summary = run.stdout[run.stdout.index("gemmtune summary"):]
    bf16_row = next(line for line in summary.splitlines() if "tiny-bf16" in line)
    assert "aten_mm" in bf16_row and " - " in bf16_row  # no time: '-', not a crash
    results = json.loads(Path(out_json).read_text())["results"]
    assert [r["name"] for r in results] == ["tiny-f32", "tiny-bf16"]
    again = _gemmtune(tmp_path, "tune", "--suite", suite, "--device", "cpu")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("cache hit:") == 2 and "gemmtune summary" in again.stdout


def _python(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(tmp_path),
                          timeout=120)


def test_import_prints_nothing_where_triton_is_missing(tmp_path):
    """torch's triton_op warns once per registration where Triton is not installed: not on our import."""
    code = ("import sys; sys.modules['triton'] = None\n"  # as on a machine without Triton
            "import torch, gemmtune\n"
            "gemmtune.mm(torch.ones(2, 2), torch.ones(2, 2), backends=('extern',))\n"
            "import gemmtune.dispatch.compiled\n"  # registers the traced ops
            "assert hasattr(torch.ops.gemmtune, 'traced_mm') and hasattr(torch.ops.gemmtune, 'mm')\n")
    run = _python(tmp_path, code)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (run.stdout, run.stderr) == ("", "")


def test_eager_use_loads_no_compiler_stack_and_a_first_trace_registers_the_ops(tmp_path):
    """gemmtune.mm, patch and warmup leave torch._dynamo unloaded (it costs about 1.5 s to import); a
    torch.compile(fullgraph=True) trace in the same process then registers the traced and custom ops."""
    code = ("import sys, torch, gemmtune\n"
            "a, b = torch.randn(8, 4), torch.randn(4, 3)\n"
            "gemmtune.mm(a, b, backends=('extern',))\n"
            "mlp = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))\n"
            "gemmtune.warmup(mlp, torch.randn(3, 4), backends=('extern',), progress=False)\n"
            "assert 'torch._dynamo' not in sys.modules, 'eager use loaded torch._dynamo'\n"
            "assert not hasattr(torch.ops.gemmtune, 'traced_mm') and not hasattr(torch.ops.gemmtune, 'mm')\n"
            "f = torch.compile(lambda x, y: gemmtune.mm(x, y, backends=('extern',)), fullgraph=True)\n"
            "assert torch.allclose(f(a, b), a @ b)\n"
            "assert hasattr(torch.ops.gemmtune, 'traced_mm') and hasattr(torch.ops.gemmtune, 'mm')\n"
            "print('ok')\n")
    run = _python(tmp_path, code)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "ok"


def test_help_imports_no_torch(tmp_path):
    code = ("import json, runpy, sys\n"
            "for argv in (['--help'], ['tune', '--help'], ['cache', '--help'], ['inductor-table', '--help']):\n"
            "    sys.argv = ['gemmtune', *argv]\n"
            "    try:\n"
            "        runpy.run_module('gemmtune', run_name='__main__', alter_sys=True)\n"
            "    except SystemExit as exc:\n"
            "        assert exc.code == 0, exc.code\n"
            "sys.stderr.write(json.dumps(sorted(sys.modules)))\n")
    run = _python(tmp_path, code)
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = json.loads(run.stderr)
    heavy = [m for m in loaded if m.split(".")[0] in ("torch", "numpy", "numba", "triton")]
    assert heavy == [] and "usage: gemmtune" in run.stdout
    assert "gemmtune.cli" in loaded and "gemmtune.engine" not in loaded


def test_piped_tune_prints_a_line_per_stage_and_no_progress_prints_none(tmp_path):
    args = ("tune", "--shape", "16x8x12", "--device", "cpu", "--backends", "extern,numpy", "--store", "off")
    run = _gemmtune(tmp_path, *args)
    assert run.returncode == 0, run.stderr[-2000:]
    stages = [line.split(" (")[0] for line in run.stderr.splitlines()]
    assert stages == ["gemmtune: 2 choices, 2 binaries: compiling", "gemmtune: compiled 2 binaries",
                      "gemmtune: benchmarking 2 choices"]
    quiet = _gemmtune(tmp_path, *args, "--no-progress")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_usage_errors_point_at_the_subcommand_and_name_flags(tmp_path):
    from gemmtune.cli import main

    cases = [(["tune", "--bogus"], "unrecognized arguments: --bogus (see gemmtune tune -h)"),
             (["tune", "--device", "cpu", "--dtype", "bf32"], "argument --dtype: unsupported dtype 'bf32'"),
             (["tune", "--device", "cpu", "--top-x", "0"], "argument --top-x: must be >= 1, got 0"),
             (["tune", "--device", "cpu", "--rows", "-1"], "argument --rows: must be >= 0, got -1")]
    for argv, expected in cases:
        run = _gemmtune(tmp_path, *argv)
        assert run.returncode == 2 and run.stderr.count("\n") == 1, (argv, run.stderr)
        assert run.stderr.startswith("gemmtune: error: ") and expected in run.stderr, (argv, run.stderr)
    assert main(["cache", "ls", "--store", str(tmp_path / "no" / "such" / "s.sqlite")]) == 2


def test_a_store_in_a_missing_directory_is_refused_and_an_unusable_one_warns_in_one_line(tmp_path):
    missing = tmp_path / "nonexistent" / "dir" / "x.sqlite"
    args = ("tune", "--shape", "8x8x8", "--device", "cpu", "--backends", "extern", "--no-progress")
    run = _gemmtune(tmp_path, *args, "--store", str(missing))
    assert run.returncode == 2 and not (tmp_path / "nonexistent").exists()
    assert run.stderr == (f"gemmtune: error: argument --store: directory {missing.parent} does not exist "
                          "(create it first, or use --store memory)\n")
    foreign = tmp_path / "notes.sqlite"
    foreign.write_text("not a database\n" * 64)  # not a gemmtune store: left untouched, picks kept in memory
    run = _gemmtune(tmp_path, *args, "--store", str(foreign))
    assert run.returncode == 0, run.stderr[-2000:]
    (line,) = run.stderr.splitlines()
    assert line.startswith("gemmtune: warning: ") and "keeping picks in memory" in line
