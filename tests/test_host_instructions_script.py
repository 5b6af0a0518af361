"""bench/host_instructions.py: its checks, and how it reads callgrind's count (a stand-in valgrind that
writes callgrind's summary line, so the test needs no valgrind)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("host_instructions", ROOT / "bench" / "host_instructions.py")
host_instructions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_instructions)

FAKE = """#!/bin/sh
# Stand-in valgrind: write a callgrind file whose summary depends on the variant, as callgrind would.
for a in "$@"; do case "$a" in --callgrind-out-file=*) out="${a#--callgrind-out-file=}";; esac; done
variant=""; prev=""; for a in "$@"; do [ "$prev" = "tiny" ] && variant="$a"; prev="$a"; done
case "$variant" in eager) n=1000;; eager_warmup) n=990;; *) n=1010;; esac
printf 'events: Ir\\nsummary: %s\\n' "$n" > "$out"
"""


@pytest.fixture()
def fake_valgrind(tmp_path, monkeypatch):
    path = tmp_path / "bin" / "valgrind"
    path.parent.mkdir()
    path.write_text(FAKE)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{path.parent}{os.pathsep}{os.environ['PATH']}")
    return path


def test_bad_arguments_are_refused_with_one_line():
    with pytest.raises(SystemExit, match="--variants: unknown \\['nope'\\]"):
        host_instructions.main(["--variants", "eager,nope"])
    with pytest.raises(SystemExit, match="--calls: must be >= 1, got 0"):
        host_instructions.main(["--calls", "0"])


def test_counts_are_read_per_forward_and_against_plain_eager(fake_valgrind, tmp_path):
    out = tmp_path / "r.json"
    assert host_instructions.main(["--model", "tiny", "--variants", "eager,eager_warmup,eager_copy",
                                   "--calls", "10", "--out", str(out)]) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["eager"]["instructions_per_forward"] == 100
    assert rows["eager_warmup"]["x_eager"] == pytest.approx(0.99)
    assert rows["eager_copy"]["x_eager"] == pytest.approx(1.01)


def test_a_failed_valgrind_run_is_an_error_naming_the_variant(tmp_path, monkeypatch):
    path = tmp_path / "valgrind"
    path.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SystemExit, match="eager: valgrind failed \\(3\\)"):
        host_instructions.count("tiny", "eager", 10, str(tmp_path))
