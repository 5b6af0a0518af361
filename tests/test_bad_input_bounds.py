"""Oversized numbers and deep or huge files are input errors: one line and exit 2 from the CLI, a typed
InputError from Python, before anything is allocated (offline/suite.py, core/validate.py)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gemmtune
from gemmtune.cli import main
from gemmtune.core.errors import InputError
from gemmtune.offline.suite import MAX_SUITE_BYTES, ProblemSpec

SRC = Path(__file__).resolve().parents[1] / "src"


def _one_line(err: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("gemmtune: error: ") and "internal error" not in line and "Traceback" not in err, line
    for needle in needles:
        assert needle in line, line
    return line


@pytest.fixture
def no_allocation(monkeypatch):
    monkeypatch.setattr(ProblemSpec, "tensors", lambda *a, **k: pytest.fail("allocated before checking"))


@pytest.mark.parametrize("shape,needles", [
    ("99999999999999999999x2x2", ["M must be at most 2147483647", "99999999999999999999"]),
    ("2x2147483648x2", ["K must be at most 2147483647"]),
    ("2147483647x2147483647x2147483647", ["too large", "A has", "more than torch can allocate"]),
    ("1" + "0" * 5000 + "x2x2", ["--shape", "three positive integers"]),
])
def test_an_oversized_shape_is_one_line_and_exit_2(shape, needles, capsys, no_allocation):
    assert main(["tune", "--no-progress", "--device", "cpu", "--store", "off", "--shape", shape]) == 2
    captured = capsys.readouterr()
    assert len(_one_line(captured.err, *needles)) < 300  # a 5001-digit number is not echoed whole
    assert captured.out == ""


def test_an_oversized_batch_of_a_bmm_is_one_line_and_exit_2(capsys, no_allocation):
    args = ["--op", "bmm", "--batch", str(2**40), "--shape", "2x2x2"]
    assert main(["tune", "--no-progress", "--device", "cpu", "--store", "off", *args]) == 2
    _one_line(capsys.readouterr().err, "batch must be at most 2147483647")


def _suite(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "suite.json"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@pytest.mark.parametrize("command", ["tune", "sweep"])
@pytest.mark.parametrize("shape,needles", [
    ({"M": 10**30, "K": 2, "N": 2}, ["shape #0", "M must be at most 2147483647", str(10**30)]),
    ({"M": 2, "K": 2, "N": 2, "op": "bmm", "batch": 2**31}, ["shape #0", "batch must be at most"]),
    ({"M": 2**31 - 1, "K": 2**31 - 1, "N": 2}, ["shape #0", "too large", "more than torch can allocate"]),
])
def test_an_oversized_number_in_a_suite_is_one_line_and_exit_2(tmp_path, capsys, no_allocation, command, shape,
                                                              needles):
    path = _suite(tmp_path, json.dumps([shape]))
    extra = ["--out", str(tmp_path / "d.jsonl")] if command == "sweep" else ["--store", "off"]
    assert main([command, "--suite", str(path), "--device", "cpu", *extra]) == 2
    _one_line(capsys.readouterr().err, f"--suite: shape #0 in {path}", *needles)


def test_a_number_past_pythons_digit_limit_in_a_suite_is_one_line_and_exit_2(tmp_path, capsys, no_allocation):
    path = _suite(tmp_path, '[{"M": 1' + "0" * 5000 + ', "K": 2, "N": 2}]')
    assert main(["tune", "--suite", str(path), "--device", "cpu", "--store", "off"]) == 2
    _one_line(capsys.readouterr().err, f"--suite: cannot read {path}")


@pytest.mark.parametrize("content", [
    "[" * 100_000 + "]" * 100_000,
    '{"shapes": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"shapes": [{"M": 2, "K": 2, "N": 2, "name": ' + "[" * 100_000 + "]" * 100_000 + "}]}",
])
def test_a_deeply_nested_suite_is_one_line_and_exit_2(tmp_path, capsys, no_allocation, content):
    path = _suite(tmp_path, content)
    assert main(["tune", "--suite", str(path), "--device", "cpu", "--store", "off"]) == 2
    _one_line(capsys.readouterr().err, f"--suite: cannot read {path}", "nested too deeply")


def test_a_nested_shape_within_pythons_limits_is_named_briefly(tmp_path, capsys, no_allocation):
    """Deep enough to be parsed, not so deep that its repr in the message could recurse without end."""
    path = _suite(tmp_path, '{"shapes": [' + "[" * 900 + "]" * 900 + "]}")
    assert main(["tune", "--suite", str(path), "--device", "cpu", "--store", "off"]) == 2
    assert len(_one_line(capsys.readouterr().err, "shape #0", "expected an object")) < 300


def test_a_suite_file_over_the_size_bound_is_refused_unparsed(tmp_path, capsys, no_allocation):
    """A sparse file a little over the bound: refused for its size, whatever its content."""
    path = tmp_path / "suite.json"
    with open(path, "wb") as f:
        f.truncate(MAX_SUITE_BYTES + 1)
    assert main(["tune", "--suite", str(path), "--device", "cpu", "--store", "off"]) == 2
    _one_line(capsys.readouterr().err, f"--suite: cannot read {path}", "larger than 16 MiB")


def _limit_heap() -> None:
    two_gib = 2 << 30
    resource.setrlimit(resource.RLIMIT_DATA, (two_gib, two_gib))


def test_a_suite_of_dev_zero_exits_2_without_reading_it_whole(tmp_path):
    """`/dev/zero` never ends: the command reads at most the bound (under a 2 GiB heap limit) and stops."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "GEMMTUNE_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "gemmtune", "tune", "--suite", "/dev/zero", "--device", "cpu",
                           "--store", "off"], capture_output=True, text=True, env=env, timeout=300,
                          preexec_fn=_limit_heap)
    assert done.returncode == 2, done.stderr[-2000:]
    _one_line(done.stderr, "--suite: cannot read /dev/zero", "larger than 16 MiB")


@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_a_batch_on_a_shape_that_is_not_a_bmm_is_refused(tmp_path, capsys, no_allocation, op):
    path = _suite(tmp_path, json.dumps([{"M": 4, "K": 2, "N": 2, "op": op, "batch": 3}]))
    assert main(["tune", "--suite", str(path), "--device", "cpu", "--store", "off"]) == 2
    _one_line(capsys.readouterr().err, "shape #0", "batch belongs to bmm only", repr(op))


def test_a_batch_on_a_bmm_shape_is_kept(tmp_path):
    from gemmtune.offline.suite import load_suite

    [spec] = load_suite(_suite(tmp_path, json.dumps([{"M": 4, "K": 2, "N": 2, "op": "bmm", "batch": 3}])))
    assert spec.batch == 3 and spec.describe() == "bmm 3x4x2x2 float32 B=row"


def _absurd(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Operands whose problem is absurdly large without their storage being so (stride-0 views)."""
    if kind == "rows":
        return torch.ones(1, 1).expand(2**40, 3), torch.ones(3, 2)
    return torch.ones(1, 1).expand(4, 2**40), torch.ones(1, 1).expand(2**40, 4)  # K = 2**40


@pytest.mark.parametrize("kind", ["rows", "inner"])
def test_tune_and_mm_of_absurd_sizes_raise_an_input_error(kind):
    a, b = _absurd(kind)
    with pytest.raises(InputError, match="too large to tune"):
        gemmtune.tune("mm", a, b, backends=("extern",))
    with pytest.raises(InputError, match="too large to tune"):
        gemmtune.mm(a, b)


def test_a_spec_of_an_absurd_size_from_python_is_an_input_error():
    with pytest.raises(InputError, match="M must be at most"):
        ProblemSpec(10**30, 2, 2)
    with pytest.raises(InputError, match="M must be at most .* got a 9966-bit integer"):
        ProblemSpec(10**3000, 2, 2)  # not written out (Python refuses to print past 4300 digits)
