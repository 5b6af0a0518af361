"""Every command's output fits 100 columns, a narrower terminal's width (or COLUMNS) when it has one,
and cuts no number: `gemmtune tune` (its AUTOTUNE table and notes), `tune --suite`'s summary,
`cache ls` and `simulate`, each run piped, piped at COLUMNS=80, and under pseudo-terminals of 80 and
200 columns; and the Python API's `autotune_table` and `WarmupReport.table`."""

import fcntl
import gzip
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import torch

from gemmtune.core.choices import Choice, Selection, Timing, as_params
from gemmtune.core.inputs import KernelInputs
from gemmtune.core.text import output_width
from gemmtune.report import autotune_table

SRC = Path(__file__).resolve().parents[1] / "src"
ANSI = re.compile(r"\x1b\[[0-9;:?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)")
# mode -> (COLUMNS, the pseudo-terminal's width or None for a pipe, the widest line allowed)
MODES = {"piped": (None, None, 100), "COLUMNS=80": ("80", None, 80), "terminal-80": (None, 80, 80),
         "terminal-200": (None, 200, 100)}


def _env(tmp_path: Path, columns: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "GEMMTUNE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("COLUMNS", None)
    return {**env, "COLUMNS": columns} if columns else env


def _under_terminal(argv: list[str], env: dict[str, str], cols: int, err: Path) -> tuple[int, str]:
    """Run `argv` with stdout a pseudo-terminal of `cols` columns (stderr to the file `err`); its exit
    status and what it wrote, escape sequences and carriage returns removed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    with open(err, "w") as stderr:
        proc = subprocess.Popen(argv, stdout=slave, stderr=stderr, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:  # read as it comes (a full terminal buffer would block the child); EIO: the child is gone
        ready, _, _ = select.select([master], [], [], 600)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    return proc.wait(timeout=600), ANSI.sub("", text).replace("\r", "")


def gemmtune(mode: str, tmp_path: Path, *args: str) -> str:
    """`python -m gemmtune ARGS` in `mode` (a key of MODES): its standard output; asserts exit 0."""
    columns, cols, _ = MODES[mode]
    argv, env = [sys.executable, "-m", "gemmtune", *args], _env(tmp_path, columns)
    if cols is None:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        return done.stdout
    err = tmp_path / "stderr.txt"
    status, out = _under_terminal(argv, env, cols, err)
    assert status == 0, err.read_text()
    return out


def assert_fits(text: str, limit: int) -> None:
    """Every line at most `limit` columns, and nothing cut: no '…' anywhere (so none next to a digit)."""
    lines = text.splitlines()
    assert lines, "no output"
    assert [line for line in lines if len(line) > limit] == [], f"lines over {limit} columns:\n{text}"
    assert not re.search(r"\d…|…\d", text), f"a number was cut:\n{text}"
    assert "…" not in text, f"something was cut:\n{text}"


@pytest.mark.parametrize("mode", MODES)
def test_the_tune_table_fits_the_width_and_cuts_no_number(mode, tmp_path):
    out = gemmtune(mode, tmp_path, "tune", "--device", "cpu", "--store", "off", "--backends", "extern,numpy",
                   "--shape", "48x40x56")
    assert_fits(out, MODES[mode][2])
    assert "AUTOTUNE mm(48x40, 40x56)" in out and "<- winner" in out
    assert re.search(r"^2 choices: 2 timed", out, re.M), out  # the count line
    assert re.search(r"^SingleProcess AUTOTUNE benchmarking takes \d+\.\d{4} seconds", out, re.M), out


@pytest.mark.parametrize("mode", MODES)
def test_the_suite_summary_fits_the_width(mode, tmp_path):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"shapes": [
        {"name": "attention_output_projection", "op": "mm", "M": 32, "K": 16, "N": 24, "dtype": "float32"},
        {"name": "mlp_down_projection_of_a_model", "op": "addmm", "M": 8, "K": 40, "N": 16, "dtype": "float32",
         "b_layout": "col"}]}))
    out = gemmtune(mode, tmp_path, "tune", "--device", "cpu", "--store", "off", "--backends", "extern,numpy",
                   "--suite", str(suite), "--no-progress")
    assert_fits(out, MODES[mode][2])
    summary = out[out.index("gemmtune summary"):]
    squeezed = "".join(line.split("│")[1].replace(" ", "") for line in summary.splitlines() if line.startswith("│"))
    assert "attention_output_projection" in squeezed and "mlp_down_projection_of_a_model" in squeezed
    assert re.search(r"\d\.\d{4} .*\d\.\d{3}x", summary), summary  # the times and ratios, whole


@pytest.mark.parametrize("mode", MODES)
def test_cache_ls_fits_the_width(mode, tmp_path):
    store = tmp_path / "a_store_directory_with_a_name_long_enough_to_pass_eighty_columns" / "store.sqlite"
    store.parent.mkdir()
    gemmtune("piped", tmp_path, "tune", "--device", "cpu", "--store", str(store), "--backends", "extern",
             "--shape", "24x40x56", "--op", "addmm", "--b-layout", "col")
    out = gemmtune(mode, tmp_path, "cache", "ls", "--store", str(store))
    assert_fits(out, MODES[mode][2])
    assert "aten_addmm" in out


@pytest.fixture
def h200_dataset(tmp_path):
    """A small gemmtune dataset whose meta line records an NVIDIA H200: two shapes, two Triton tiles at
    two swizzles each, and the library kernel."""
    path = tmp_path / "small.jsonl.gz"
    lines = [{"type": "meta", "format": "gemmtune-dataset/1", "env": {"device": "NVIDIA H200"},
              "date": "2026-11-30T10:03:21+00:00"}]
    for i, (M, K, N) in enumerate(((512, 1024, 2048), (4096, 4096, 4096))):
        choices = [{"template": "triton_mm", "src_hash": "x", "family": "triton",
                    "config": dict(BLOCK_M=bm, BLOCK_N=128, BLOCK_K=64, num_stages=3, num_warps=4),
                    "runtime_params": {"swizzle": s}, "ms": 0.1 * (i + 1) * (1 + bm / 256 + s / 100), "status": "ok",
                    "compile_s": 2.0} for bm in (64, 128) for s in (1, 8)]
        choices.append({"template": "aten_mm", "src_hash": None, "family": "extern", "config": {},
                        "runtime_params": {}, "ms": 0.12 * (i + 1), "status": "ok", "compile_s": None})
        lines.append({"type": "shape", "name": f"s{i}", "op": "mm", "M": M, "K": K, "N": N, "batch": 1,
                      "dtype": "bfloat16", "choices": choices})
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def _strategy_rows(out: str) -> list[str]:
    """The strategy names of `simulate`'s table: a row starts on the line that holds its numbers, and its
    name may fold over the next lines."""
    names: list[str] = []
    for line in out.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.split("│")[1:-1]]
            if cells[1]:
                names.append(cells[0])
            else:
                names[-1] += cells[0]
    return names


@pytest.mark.parametrize("mode", MODES)
def test_simulate_fits_the_width_says_where_its_data_comes_from_and_shows_the_strategies_that_matter(
        mode, tmp_path, h200_dataset):
    out = gemmtune(mode, tmp_path, "simulate", "--dataset", str(h200_dataset))
    assert_fits(out, MODES[mode][2])
    source = f"timings recorded on an NVIDIA H200 on 2026-11-30 ({h200_dataset})"  # the path may fold
    assert "".join(out.split()).startswith("".join(source.split()))
    names = _strategy_rows(out)
    assert names[0] == "exhaustive" and names[-1] == "default" and len(names) <= 5  # and each family's best
    assert "--all shows every one" in " ".join(out.split())


def test_simulate_all_lists_every_strategy(tmp_path, h200_dataset):
    from gemmtune.offline.simulate import default_specs, load

    out = gemmtune("piped", tmp_path, "simulate", "--dataset", str(h200_dataset), "--all")
    assert_fits(out, 100)
    assert len(_strategy_rows(out)) == len(default_specs(load(h200_dataset)[0])) > 5
    assert "--all" not in out


def test_simulate_on_the_shipped_data_is_short_and_names_the_h200(tmp_path):
    out = gemmtune("COLUMNS=80", tmp_path, "simulate")
    assert_fits(out, 80)
    assert "timings recorded on an NVIDIA H200" in out and "shipped with gemmtune" in " ".join(out.split())
    assert 3 <= len(_strategy_rows(out)) <= 6  # of the 32 simulated


# -- the Python API ---------------------------------------------------------------------------------------

def _long_selection() -> Selection:
    """A hand-made Selection with long names, large times, a failure with a long message, and a row faster
    than the winner (which lost on the library margin)."""
    lib = Choice("aten_mm", None)
    tile = lambda bm, g: Choice("triton_mm_persistent_tma", "h", as_params(  # noqa: E731
        {"BLOCK_M": bm, "BLOCK_N": 256, "BLOCK_K": 128, "num_stages": 4, "num_warps": 8, "EPILOGUE_SUBTILE": 2}),
        as_params({"swizzle": g, "NUM_SMS": 132}), family="triton")
    ki = KernelInputs.from_tensors("mm", torch.ones(4, 4), torch.ones(4, 4))
    timings = (Timing(lib, 12345.6789, "finalist"), Timing(tile(128, 8), 12300.0001, "finalist"),
               Timing(tile(128, 4), 12999.5, "final"), Timing(tile(64, 8), 23456.7891, "final"),
               Timing(tile(256, 8), None, "final", "compile_failed",
                      "out of resource: shared memory, Required: 262144, Hardware limit: 232448. Reducing block "
                      "sizes or `num_stages` may help."))
    return Selection(ki, lib, timings, None, "prescreen", 4, 1234.5, 2345.6, 3456.7, 4567.8, "cpu",
                     noisy=True, provisional=True, background_load=1.8)


@pytest.mark.parametrize("width", [80, 100])
def test_autotune_table_fits_the_width_and_keeps_every_number_whole(width):
    sel = _long_selection()
    table = autotune_table(sel, width=width)
    assert_fits(table, width)
    for t in sel.timings:
        if t.ms is not None and t is not sel.timings[2]:  # the third is folded into its kernel's row
            assert f"{t.ms:.4f} ms" in table  # every row's time, whole
    assert "lost: library margin" in table and "(best of 2)" in table


def test_autotune_table_by_default_fits_the_terminal_or_100_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # a wide terminal: 100 at most
    assert max(len(line) for line in autotune_table(_long_selection()).splitlines()) <= 100
    monkeypatch.setenv("COLUMNS", "70")
    assert max(len(line) for line in autotune_table(_long_selection()).splitlines()) <= 70


def test_the_warmup_report_table_fits_the_width():
    from gemmtune.dispatch.in_model import InModel
    from gemmtune.dispatch.warmup import WarmupReport, WarmupRow

    winner = "triton_mm_persistent_tma_bm128_bn256_bk128_s4_w8[swizzle=8]"
    rows = tuple(WarmupRow(f"addmm({n}, 4096x{n}, {n}x{n}, bfloat16)", 12, winner, 1.2345, 1.3456, 12.34, False,
                           InModel("p", winner, 1.05, True, 1.0312, together=True, stored=True)) for n in (4096, 14336))
    report = WarmupReport(rows, 123.45, 1.23, 4.56, released=tuple(f"model.layers.{i}.mlp" for i in range(12)))
    for width in (80, 100):
        text = report.table(width)
        assert_fits(text, width)
        assert text.count("1.2345") == 2 and text.count(winner) == 2  # numbers and names whole
        assert text.splitlines()[0].split()[:3] == ["problem", "calls", "ms"]


@pytest.mark.parametrize("cols, expected", [(200, 100), (60, 60)])
def test_a_terminal_gives_its_width_up_to_100_columns(cols, expected, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    with os.fdopen(slave, "w") as terminal:
        assert output_width(terminal) == expected
    os.close(master)


def test_the_regret_plot_draws_no_negative_regret():
    pytest.importorskip("matplotlib")
    from gemmtune.offline.simulate_report import regret_figure
    from gemmtune.offline.simulate_results import ShapeResult, SimulationReport, StrategyResult

    result = lambda name, regret: StrategyResult(name, (ShapeResult((8, 8, 8), "s", "a", regret, 1, 2, 0, 0.0),))  # noqa: E731
    ax = regret_figure(SimulationReport((result("exhaustive", 0.0), result("prescreen[x=1]", 1.37),
                                         result("default", 0.0)))).axes[0]
    assert ax.get_ylim()[0] == 0.0
    assert all(y >= 0.0 for c in ax.collections for _, y in c.get_offsets())
