"""The commands' manners: `cache show` summarises (`--json` for all), `cache clear` asks first or takes
`--yes`, no match is one line and exit 1, an empty store says so, `--op bmm` needs `--batch`, argument
errors come before torch is imported, a closed stdout ends quietly with `--json` written first, and
`gemmtune.tune` prints stage lines off a terminal unless `progress=False`."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gemmtune.cli import main
from gemmtune.cli.cache_show import TOP
from gemmtune.store.keys import Row, canon
from gemmtune.store.sqlite import Store

SRC = Path(__file__).resolve().parents[1] / "src"
SMALL = ["tune", "--shape", "16x8x12", "--device", "cpu", "--backends", "extern", "--store", "off", "--no-progress"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "GEMMTUNE_CACHE_DIR": str(tmp_path), "COLUMNS": "80"}


def _python(code: str, tmp_path: Path, **kw) -> subprocess.CompletedProcess:
    """`python -c CODE` in a fresh interpreter (stdin from /dev/null unless given)."""
    kw.setdefault("stdin", subprocess.DEVNULL)
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=_env(tmp_path),
                          timeout=300, cwd=tmp_path, **kw)


def _store_with(path: Path, problems: dict[str, int]) -> Store:
    """A real SQLite store holding, per problem description, a pick (the second fastest row) and `n` timings."""
    store = Store(str(path))
    for describe, n in problems.items():
        rows = [Row("numba_mm", "h", canon({"BLOCK_M": 16 * (i + 1)}), canon({"group": 1}), 0.5 + i, "ok")
                for i in range(n)]
        store.save("env", {"device": "cpu"}, f"{describe}/float32/0123456789abcdef", describe, rows,
                   rows[min(1, n - 1)], replace_pick=False)
    return store


# -- cache show ----------------------------------------------------------------------------------------

def test_cache_show_prints_a_summary_per_problem_not_raw_json(tmp_path, capsys):
    where = tmp_path / "s.sqlite"
    _store_with(where, {"mm(64x32, 32x16)": TOP + 3, "mm(64x48, 48x16)": 2, "mm(8x8, 8x8)": 1})
    assert main(["cache", "show", "64x", "--store", str(where)]) == 0
    out = capsys.readouterr().out
    assert "{" not in out and '"choices"' not in out
    assert "mm(64x32, 32x16) on cpu: numba_mm BLOCK_M=32 group=1, 1.5000 ms" in out
    assert "mm(64x48, 48x16)" in out and "mm(8x8, 8x8)" not in out
    assert out.count("<- pick") == 2
    first = out[:out.index("mm(64x48")]
    ranks = [line.split()[0] for line in first.splitlines() if re.match(r"\s*\d+\s+numba_mm", line)]
    assert ranks == [str(n) for n in range(1, TOP + 1)] and f"{TOP} of {TOP + 3} timings shown; --json for all" in first
    assert "BLOCK_M=16 group=1" in first and f"BLOCK_M={16 * (TOP + 1)} " not in first  # the fastest, in order
    assert max(len(line) for line in out.splitlines()) <= 100


def test_cache_show_json_prints_every_stored_timing(tmp_path, capsys):
    where = tmp_path / "s.sqlite"
    _store_with(where, {"mm(64x32, 32x16)": TOP + 3})
    assert main(["cache", "show", "64x32", "--json", "--store", str(where)]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [p["describe"] for p in found] == ["mm(64x32, 32x16)"] and len(found[0]["choices"]) == TOP + 3


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_cache_show_matching_nothing_is_one_line_and_exit_1(tmp_path, capsys, extra):
    where = tmp_path / "s.sqlite"
    _store_with(where, {"mm(64x32, 32x16)": 2})
    assert main(["cache", "show", "1024x1024", *extra, "--store", str(where)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "no stored problem matches '1024x1024'" in lines[0] and str(where) in lines[0]


def test_cache_ls_of_an_empty_store_is_one_line_exit_0(tmp_path, capsys):
    where = tmp_path / "empty.sqlite"
    assert main(["cache", "ls", "--store", str(where)]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [f"the store {where} holds no picks"]


# -- cache clear ---------------------------------------------------------------------------------------

def _clear(where: Path) -> str:
    """`gemmtune cache clear --store WHERE` (no --yes) as a `python -c` program."""
    return f"import sys; from gemmtune.cli import main; sys.exit(main(['cache', 'clear', '--store', {str(where)!r}]))"


def test_cache_clear_off_a_terminal_without_yes_refuses_and_deletes_nothing(tmp_path):
    where = tmp_path / "s.sqlite"
    _store_with(where, {"mm(64x32, 32x16)": 2, "mm(64x48, 48x16)": 2})
    done = _python(_clear(where), tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds 2 picks" in lines[0] and "--yes" in lines[0] and "nothing was deleted" in lines[0]
    assert len(Store(str(where)).problems()) == 2
    assert main(["cache", "clear", "--yes", "--store", str(where)]) == 0
    assert Store(str(where)).problems() == []


@pytest.mark.parametrize("answer, status, left", [("n", 1, 2), ("", 1, 2), ("y", 0, 0)])
def test_cache_clear_on_a_terminal_asks_first(tmp_path, answer, status, left):
    where = tmp_path / "s.sqlite"
    _store_with(where, {"mm(64x32, 32x16)": 2, "mm(64x48, 48x16)": 2})
    parent, child = pty.openpty()  # stdin is a terminal
    try:
        os.write(parent, f"{answer}\n".encode())  # typed ahead: the terminal holds the line until it is read
        done = _python(_clear(where), tmp_path, stdin=child)
    finally:
        os.close(child)
        os.close(parent)
    assert f"clear 2 picks from {where}? [y/N]" in done.stderr
    assert done.returncode == status, done.stderr
    assert len(Store(str(where)).problems()) == left
    assert ("cleared 2 picks" in done.stdout) == (answer == "y")


# -- argument errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["tune", "--op", "bmm", "--shape", "8x8x8"], "argument --batch: --op bmm needs the batch size"),
    (["tune", "--op", "bmm"], "argument --batch: --op bmm needs the batch size"),
    (["tune", "--op", "mm", "--batch", "4"], "argument --batch: only --op bmm takes a batch"),
    (["inductor-table", "--out", "t.json", "--shape", "8x8x8", "--op", "bmm"], "--op bmm needs the batch size"),
])
def test_bmm_without_batch_and_batch_without_bmm_are_one_line_exit_2(args, needle, capsys):
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gemmtune: error: ") and needle in lines[0], lines
    assert captured.out == ""


@pytest.mark.parametrize("args, needle", [
    (["tune", "--shape", "12x"], "--shape: expected MxKxN"),
    (["tune", "--shape", "99999999999999999999x2x2"], "M must be at most"),
    (["tune", "--dtype", "int8"], "argument --dtype: unsupported dtype 'int8'"),
    (["tune", "--op", "conv"], "argument --op: invalid choice"),
    (["tune", "--op", "bmm", "--batch", "0"], "batch must be a positive integer"),
    (["tune", "--op", "bmm"], "--op bmm needs the batch size"),
    (["tune", "--device", "tpu"], "unknown device 'tpu'"),
    (["tune", "--device", "mps"], "gemmtune tunes on cpu or cuda, not 'mps'"),
    (["tune", "--top-x", "0"], "argument --top-x"),
    (["inductor-table", "--out", "t.json", "--shape", "4x4"], "--shape: expected MxKxN"),
    (["sweep", "--suite", "s.json", "--out", "d.jsonl", "--dtype", "int8"], "unsupported dtype 'int8'"),
])
def test_argument_errors_come_before_torch_is_imported(args, needle, tmp_path):
    done = _python(f"import sys; from gemmtune.cli import main; rc = main({args!r}); print(rc, 'torch' in sys.modules)",
                   tmp_path)
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_the_dtype_names_checked_without_torch_are_the_dtypes_gemmtune_takes():
    import torch

    from gemmtune.core.dtype_names import FP8_NAMES, NAMES
    from gemmtune.core.inputs import FP8_DTYPES, SUPPORTED_DTYPES

    assert tuple(getattr(torch, n) for n in NAMES) == SUPPORTED_DTYPES
    assert tuple(getattr(torch, n) for n in FP8_NAMES) == FP8_DTYPES


# -- a closed stdout -----------------------------------------------------------------------------------

def _with_stdout_unread(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run `code` with stdout a pipe whose reader is already closed (`| head` after it stopped reading)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return _python(code, tmp_path, stdout=write_end)
    finally:
        os.close(write_end)


def test_a_tune_whose_reader_went_away_exits_0_quietly_with_the_json_written_first(tmp_path):
    out = tmp_path / "sel.json"
    args = [*SMALL, "--json", str(out)]
    done = _with_stdout_unread(f"import sys; sys.argv[1:] = {args!r}; from gemmtune.cli import main; sys.exit(main())",
                               tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "error" not in done.stderr and "Broken pipe" not in done.stderr
    assert json.loads(out.read_text())["winner"] == "aten_mm"


def test_a_tune_piped_into_head_exits_0(tmp_path):
    command = " ".join([sys.executable, "-m", "gemmtune", *SMALL])
    done = subprocess.run(["sh", "-c", f"{{ {command}; echo status=$? >&2; }} | head -1"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=_env(tmp_path), timeout=300, cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and "mm(16x8, 8x12)" in lines[0]
    assert done.stderr.strip().splitlines() == ["status=0"], done.stderr


def test_a_plain_write_to_a_closed_stdout_also_ends_quietly(tmp_path):
    code = ("import sys\nfrom gemmtune import cli\n"
            "def cmd(args):\n    sys.stdout.write('row\\n' * 100)\n    sys.stdout.flush()\n    return 0\n"
            "cli.cmd_sweep = cmd\n"
            "rc = cli.main(['sweep', '--suite', 's.json', '--out', 'd.jsonl'])\n"
            "sys.stderr.write(f'rc={rc}\\n')\nsys.exit(rc)")
    done = _with_stdout_unread(code, tmp_path)
    assert done.returncode == 0 and done.stderr.strip() == "rc=0", done.stderr


def test_a_broken_pipe_that_is_not_stdouts_is_an_error(capsys, monkeypatch):
    from gemmtune.cli import cache as cli_cache

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli_cache, "cmd_cache", broken)
    assert main(["cache", "ls"]) == 2
    assert "Broken pipe" in capsys.readouterr().err


# -- stage lines of the Python API ---------------------------------------------------------------------

TUNE = ("import torch, gemmtune\n"
        "a, b = torch.randn(24, 16), torch.randn(16, 8)\n"
        "gemmtune.tune('mm', a, b, backends=('extern', 'numpy'), settings=gemmtune.Settings(store='off'){extra})\n")


def test_tune_with_progress_prints_stage_lines_on_stderr_off_a_terminal(tmp_path):
    done = _python(TUNE.format(extra=", progress=True"), tmp_path)
    assert done.returncode == 0, done.stderr
    stages = [line.split(" (")[0] for line in done.stderr.splitlines() if line.startswith("gemmtune: ")]
    assert stages == ["gemmtune: 2 choices, 2 binaries: compiling", "gemmtune: compiled 2 binaries",
                      "gemmtune: benchmarking 2 choices"], done.stderr


def test_tune_with_progress_false_prints_nothing_even_past_the_quiet_time(tmp_path):
    code = "import gemmtune.pipeline.progress as p; p.QUIET_S = 0.0\n" + TUNE.format(extra=", progress=False")
    done = _python(code, tmp_path)
    assert done.returncode == 0 and "gemmtune: " not in done.stderr, done.stderr


def test_tune_by_default_holds_its_stage_lines_back_for_the_quiet_time(tmp_path, monkeypatch):
    import torch

    import gemmtune
    from gemmtune.pipeline import progress

    monkeypatch.setattr(progress, "QUIET_S", 3600.0)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    gemmtune.tune("mm", torch.randn(24, 16), torch.randn(16, 8), backends=("extern", "numpy"),
                  settings=gemmtune.Settings(store="off"))
    assert sys.stderr.getvalue() == ""


def test_held_stage_lines_come_out_once_the_quiet_time_has_passed_and_none_after_the_tune():
    from gemmtune.pipeline.progress import Deferred

    lines: list[str] = []
    held = Deferred(lines.append, after_s=0.0)
    held("compiling")
    held._timer.join()  # the quiet time has passed
    held("benchmarking")
    held.close()
    held("late")
    assert lines == ["compiling", "benchmarking"]


def test_by_default_a_listener_or_a_terminal_gets_no_stage_lines(monkeypatch):
    from gemmtune.pipeline.progress import stage_lines

    lines: list[str] = []
    events: list[str] = []
    with stage_lines(None, lambda event, **info: events.append(event), write=lines.append, after_s=0.0) as listen:
        listen("choices", total=2, binaries=2)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    with stage_lines(None, write=lines.append, after_s=0.0) as listen:
        listen("choices", total=2, binaries=2)
    assert events == ["choices"] and lines == []


def test_warmup_with_progress_false_silences_the_stage_lines_of_its_tunes(monkeypatch):
    import torch

    import gemmtune
    from gemmtune.pipeline import progress

    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # every tune counts as a long one
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8))
    gemmtune.warmup(model, torch.randn(5, 16), backends=("extern", "numpy"), progress=False)
    assert "choices," not in sys.stderr.getvalue() and "binaries" not in sys.stderr.getvalue()
