"""The CLI's manners: one-line errors (exit 2) checked before allocating, piped output that fits its width,
`python -m gemmtune`, `--version`, -v/-vv logging, and the store's per-device env_info."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gemmtune import cli
from gemmtune.cli import main
from gemmtune.cli import cache as cli_cache
from gemmtune.offline.suite import ProblemSpec
from gemmtune.store import env as store_env
from gemmtune.store.sqlite import env_info, env_key

SRC = Path(__file__).resolve().parents[1] / "src"


def run_module(*args, tmp_path):
    """`python -m gemmtune ARGS` with stdout and stderr piped (not terminals), an 80-column COLUMNS."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "80", "GEMMTUNE_CACHE_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "gemmtune", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def assert_one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gemmtune") and "error:" in lines[0]
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


# -- 1. one-line errors, exit 2 ------------------------------------------------------------------------

@pytest.mark.parametrize("args,needles", [
    (["--device", "tpu"], ["--device", "'tpu'", "expected cpu or cuda"]),
    (["--device", "CPU"], ["--device", "'CPU'", "did you mean 'cpu'"]),
    (["--device", "meta"], ["--device", "cpu or cuda"]),
    (["--shape", "-5x4x4"], ["--shape", "-5x4x4", "positive integers"]),
    (["--shape"], ["--shape", "expected one argument"]),
    (["--no-such-flag"], ["unrecognized arguments: --no-such-flag"]),
    (["--op", "conv"], ["--op", "invalid choice"]),
    (["--batch", "-2", "--op", "bmm", "--shape", "4x4x4"], ["batch", "positive integer"]),
])
def test_bad_argument_is_one_line_exit_2(args, needles, capsys, monkeypatch):
    monkeypatch.setattr(ProblemSpec, "tensors", lambda *a, **k: pytest.fail("allocated before checking"))
    assert main(["tune", "--no-progress", "--store", "off", *args]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.err, *needles)
    assert captured.out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_unavailable_cuda_is_one_line_exit_2(device, capsys):
    assert main(["tune", "--no-progress", "--device", device]) == 2
    assert_one_line_error(capsys.readouterr().err, "--device", "not available", "--device cpu")


@pytest.mark.parametrize("command", [["tune", "--shape", "100000x100000x100000"],
                                     ["tune", "--shape", "100000x100000x100000", "--op", "addmm"],
                                     ["tune", "--op", "bmm", "--batch", "1000", "--shape", "10000x10000x10000"]])
def test_too_large_is_refused_before_allocating(command, capsys, monkeypatch):
    from gemmtune.offline import checks

    monkeypatch.setattr(checks, "available_bytes", lambda device: 8 << 30)  # 8 GiB free, whatever this machine has
    monkeypatch.setattr(ProblemSpec, "tensors", lambda *a, **k: pytest.fail("allocated before checking"))
    assert main([*command, "--no-progress", "--device", "cpu", "--store", "off"]) == 2
    assert_one_line_error(capsys.readouterr().err, "--shape", "too large to tune on cpu", "8.0 GiB is free")


def test_too_large_shape_of_a_suite_is_refused_before_any_tune(tmp_path, capsys, monkeypatch):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"shapes": [{"name": "small", "M": 8, "K": 8, "N": 8},
                                            {"name": "huge", "M": 100000, "K": 100000, "N": 100000}]}))
    monkeypatch.setattr(cli, "tune", lambda *a, **k: pytest.fail("tuned before checking every shape"))
    assert main(["tune", "--no-progress", "--device", "cpu", "--suite", str(suite), "--store", "off"]) == 2
    assert_one_line_error(capsys.readouterr().err, "--suite (huge)", "too large")


def test_error_as_a_subprocess_is_one_line_exit_2(tmp_path):
    done = run_module("tune", "--device", "tpu", "--shape", "8x8x8", tmp_path=tmp_path)
    assert done.returncode == 2
    assert_one_line_error(done.stderr, "--device", "'tpu'")
    long = run_module("tune", "--device", "cpu", "--dtype", "int8", tmp_path=tmp_path)
    assert long.returncode == 2  # a message longer than 80 columns stays on one line when piped
    assert len(long.stderr.strip()) > 80
    assert_one_line_error(long.stderr, "int8", "float16, bfloat16, float32, float64")


def test_bug_is_one_line_exit_1_and_vv_shows_the_traceback(capsys, monkeypatch):
    monkeypatch.setattr(cli_cache, "cmd_cache", lambda args: 1 / 0)
    assert main(["cache", "ls"]) == 1
    assert_one_line_error(capsys.readouterr().err, "internal error: ZeroDivisionError", "-vv")
    with pytest.raises(ZeroDivisionError):
        main(["-vv", "cache", "ls"])


# -- 3. piped output fits its width, nothing cut --------------------------------------------------------

def test_piped_output_wraps_to_columns_and_cuts_nothing(tmp_path):
    store = tmp_path / "store.sqlite"
    done = run_module("tune", "--device", "cpu", "--shape", "24x40x56", "--op", "addmm", "--b-layout", "col",
                      "--store", str(store), "-v", tmp_path=tmp_path)  # -v: with the legend
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and max(len(line) for line in done.stdout.splitlines()) <= 80  # COLUMNS=80
    assert "numba_mm_bk" in done.stdout and "interleaved final" in done.stdout
    legend = done.stdout[done.stdout.index("\nstage: "):].split("\nSingleProcess")[0]
    assert len(legend.splitlines()) > 1 and " ".join(legend.split()).startswith("stage: interleaved final =")  # wrapped
    ls = run_module("cache", "ls", "--store", str(store), tmp_path=tmp_path)
    assert ls.returncode == 0, ls.stderr
    assert "…" not in ls.stdout and max(len(line) for line in ls.stdout.splitlines()) <= 80
    from gemmtune.store.sqlite import Store

    keys = [p["problem"] for p in Store(store).problems()]  # whole, though folded over the lines of their cells
    cells = "".join(line.split("│")[1].replace(" ", "") for line in ls.stdout.splitlines() if line.startswith("│"))
    assert keys and all(len(k) > 40 and k.replace(" ", "") in cells for k in keys)


# -- 4. conventions -------------------------------------------------------------------------------------

def test_python_m_gemmtune_and_version(tmp_path):
    from gemmtune.core.version import __version__

    done = run_module("--version", tmp_path=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == f"gemmtune {__version__}"
    helped = run_module("-h", tmp_path=tmp_path)
    assert helped.returncode == 0 and "tune" in helped.stdout


@pytest.fixture
def gemmtune_logger():
    logger = logging.getLogger("gemmtune")
    level = logger.level
    yield logger
    logger.setLevel(level)


def test_verbose_logs_phases_and_vv_each_choice(caplog, gemmtune_logger):
    args = ["tune", "--no-progress", "--device", "cpu", "--shape", "16x24x8", "--store", "off"]
    caplog.set_level(logging.DEBUG, logger="gemmtune")  # the capture handler takes all; main sets the logger's level
    assert main([*args, "-v"]) == 0
    info = [r.getMessage() for r in caplog.records if r.name == "gemmtune" and r.levelno == logging.INFO]
    assert any("compiling" in m for m in info) and any("searching with" in m for m in info)
    assert any("picked" in m and "deciding time" in m for m in info)
    assert not [r for r in caplog.records if r.name == "gemmtune" and r.levelno == logging.DEBUG]
    caplog.clear()
    assert main(["-vv", *args]) == 0
    debug = [r.getMessage() for r in caplog.records if r.name == "gemmtune" and r.levelno == logging.DEBUG]
    assert any("aten_mm" in m and " ms (" in m for m in debug)
    caplog.clear()
    assert main(args) == 0
    assert not [r for r in caplog.records if r.name == "gemmtune" and r.levelno < logging.WARNING]


def test_half_precision_on_cpu_says_why_nothing_was_timed(capsys):
    assert main(["tune", "--no-progress", "--device", "cpu", "--dtype", "float16", "--shape", "16x16x16",
                 "--store", "off"]) == 0
    out = capsys.readouterr().out
    assert "not timed: pinned" not in out
    assert "the only candidate (no other template supports float16 on cpu" in out
    assert "nothing to compare" in out


def test_json_has_versions_and_timestamp(tmp_path):
    path = tmp_path / "sel.json"
    assert main(["tune", "--no-progress", "--device", "cpu", "--shape", "8x8x8", "--backends", "extern",
                 "--store", "off", "--json", str(path)]) == 0
    d = json.loads(path.read_text())
    assert set(d["versions"]) == {"gemmtune", "torch", "triton", "numba", "numpy"}
    assert d["versions"]["torch"] == torch.__version__ and d["versions"]["numba"]
    assert d["timestamp"][:2] == "20" and "T" in d["timestamp"]
    assert d["winner"] and d["choices"]  # the Selection's fields are as before


# -- 5. env_info per device --------------------------------------------------------------------------------

def test_cpu_env_names_cpu_model_blas_numba_numpy():
    import numba
    import numpy

    info = env_info("cpu")
    assert info["cpu_model"] == store_env.cpu_model() and info["device"] == info["cpu_model"]
    assert info["numba"] == numba.__version__ and info["numpy"] == numpy.__version__
    assert info["torch"] == torch.__version__ and info["threads"] == torch.get_num_threads()
    assert "torch_blas" in info and "numpy_blas" in info
    assert "triton" not in info  # a CPU timing does not depend on Triton


def test_cpu_env_key_changes_with_numba_version(monkeypatch):
    before = env_key(env_info("cpu"))
    store_env._cpu_env.cache_clear()
    real = store_env.package_version
    monkeypatch.setattr(store_env, "package_version", lambda n: "0.0.1" if n == "numba" else real(n))
    try:
        assert env_key(env_info("cpu")) != before
    finally:
        store_env._cpu_env.cache_clear()


def test_gpu_env_names_gpu_driver_cuda_torch_triton(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(store_env, "nvidia_driver", lambda: "570.1")
    store_env._gpu_env.cache_clear()
    try:
        info = env_info("cuda:0")
    finally:
        store_env._gpu_env.cache_clear()
    assert info["device"] == "NVIDIA H200" and info["capability"] == [9, 0]
    assert info["driver"] == "570.1" and info["cuda"] == "12.8" and info["torch"] == torch.__version__
    assert "triton" in info and "gemmtune" in info
    assert "numba" not in info and "cpu_model" not in info
