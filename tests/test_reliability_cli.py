"""Ctrl-C on `gemmtune tune` and malformed lookup tables / import files: one line, a typed error, no traceback."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gemmtune.core.errors import LookupTableError
from gemmtune.store.lookup import LookupTable

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}


@pytest.mark.parametrize("delay", [0.0, 0.4, 1.5])  # after the first problem: compiling, benchmarking, later
def test_sigint_exits_130_within_2s_with_one_line_and_a_sound_store(tmp_path, delay):
    store = tmp_path / "s.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "gemmtune.cli", "tune", "--suite", _suite(tmp_path), "--device",
                             "cpu", "--backends", "numba,extern", "--store", str(store), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout.readline()  # main() runs (its handler is installed): the first problem's report
    time.sleep(delay)
    if proc.poll() is not None:
        pytest.skip("finished before the signal")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines() == ["interrupted; nothing was stored for the current problem"]
    assert took < 2.0
    if store.exists():
        db = sqlite3.connect(store)
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        db.execute("SELECT count(*) FROM picks").fetchone()


HANG_IN_REFERENCE = """
import ctypes, sys
import gemmtune.measure.correctness as correctness
from gemmtune.cli import main

def hang(ki, tensors):
    # a C call that no signal ends (a normal mutex locked twice by one thread), where a float64
    # reference or a library GEMM of a large problem spends its seconds
    print("in the reference", flush=True)
    libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)

correctness.reference = hang
sys.argv = ["gemmtune", *sys.argv[1:]]
sys.exit(main())
"""


def test_sigint_exits_at_once_while_a_c_call_runs(tmp_path):
    """A signal handler runs between bytecodes: Ctrl-C during one long C call (the float64 reference of a
    big shape: 21 s) waited for it.  The command runs in a worker thread; the main thread exits."""
    proc = subprocess.Popen([sys.executable, "-c", HANG_IN_REFERENCE, "tune", "--shape", "64x64x64", "--device",
                             "cpu", "--backends", "extern", "--store", "off", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline() == "in the reference\n"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines() == ["interrupted; nothing was stored for the current problem"]
    assert took < 5.0  # a slice of the main thread's wait (0.1 s), plus a loaded machine's scheduling


def test_sigint_exits_at_once_during_a_large_problem(tmp_path):
    """End to end: Ctrl-C while a float64 6144^3 problem is checked and timed (one aten run is a single
    C call of 11 s on the 2-core CPU machine)."""
    proc = subprocess.Popen([sys.executable, "-m", "gemmtune", "tune", "--shape", "6144x6144x6144", "--dtype", "float64", "--device", "cpu",
                             "--backends", "extern", "--store", "off", "--no-progress", "-v"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        for line in proc.stderr:
            if "searching with" in line:  # compiled: the reference, the checks and the timings follow
                break
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted; nothing was stored for the current problem"
    assert took < 5.0


def _suite(tmp_path: Path) -> str:
    shapes = [{"name": f"s{i}", "M": 64 + 8 * i, "K": 64, "N": 64 + 16 * i, "dtype": "float32"} for i in range(40)]
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(shapes))
    return str(path)


BAD_TABLES = {
    "pin_is_string": {"p": ["aten_mm"]},
    "pin_is_null": {"p": [None]},
    "pin_without_template": {"p": [{"config": {}}]},
    "config_is_list": {"p": [{"template": "aten_mm", "config": [1, 2]}]},
    "export_without_entries": {"format": "gemmtune-store/1"},
    "export_entries_not_list": {"format": "gemmtune-store/1", "entries": {"a": 1}},
    "export_entry_without_pick": {"format": "gemmtune-store/1", "entries": [{"problem": "p", "timings": []}]},
}


@pytest.mark.parametrize("kind", list(BAD_TABLES))
def test_malformed_lookup_table_is_a_typed_error_naming_file_and_entry(tmp_path, kind):
    path = tmp_path / "table.json"
    path.write_text(json.dumps(BAD_TABLES[kind]))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(LookupTableError, match=str(path).replace(".", r"\.")):
        LookupTable.load(path)
    proc = subprocess.run([sys.executable, "-m", "gemmtune.cli", "tune", "--shape", "8x8x8", "--device", "cpu",
                           "--backends", "extern", "--store", "memory", "--lookup-table", str(path), "--no-progress"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and str(path) in proc.stderr.replace("\n", "")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_unknown_template_pin_is_a_load_time_warning():
    with pytest.warns(RuntimeWarning, match="unknown template 'aten_mmm'"):
        table = LookupTable.load({"p": [{"template": "aten_mmm"}]})
    assert table.unknown


def test_cache_import_of_entry_without_env_exits_2_and_stores_nothing(tmp_path):
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"format": "gemmtune-store/1", "entries": [
        {"problem": "p", "pick": {"template": "aten_mm", "src_hash": None, "config": {}, "runtime_params": {},
                                  "ms": 1.0}, "timings": []}]}))
    store = tmp_path / "s.sqlite"
    proc = subprocess.run([sys.executable, "-m", "gemmtune.cli", "cache", "import", str(path), "--store", str(store)],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    err = proc.stderr.replace("\n", " ")  # rich wraps long lines
    assert "'env'" in err and "entry 0" in err and not store.exists() or _no_picks(store)


def _no_picks(store: Path) -> bool:
    return sqlite3.connect(store).execute("SELECT count(*) FROM picks").fetchone()[0] == 0


def test_ctrl_c_while_waiting_for_compiles_cancels_the_queued_ones():
    import threading

    from gemmtune.measure.compile import CompileJob

    started, release = [], threading.Event()

    class Slow:
        def compile(self, c, ki, example):
            started.append(c)
            release.wait(5)
            return object()

    class C:
        def __init__(self, i):
            self.binary_key, self.template_uid, self.name = ("k", i), "slow", f"c{i}"

    job = CompileJob([C(i) for i in range(20)], {"slow": Slow()}, None, (), timeout_s=60, workers=2)
    calls = []

    def interrupted(timeout):
        calls.append(timeout)
        raise KeyboardInterrupt

    job._poll = interrupted
    with pytest.raises(KeyboardInterrupt):
        job.finish()
    release.set()
    job._pool.shutdown(wait=True)
    assert len(started) <= 2  # the 18 queued compiles were cancelled, not run


def test_a_config_the_template_cannot_build_is_a_load_time_warning():
    with pytest.warns(RuntimeWarning, match="library kernel has no config"):
        table = LookupTable.load({KEY: [{"template": "aten_mm", "config": {"BLOCK_M": 64}}]})
    assert len(table.unknown) == 1
    with pytest.warns(RuntimeWarning, match="no runtime parameter 'bogus'"):
        LookupTable.load({KEY: [{"template": "aten_mm", "runtime_params": {"bogus": 1}}]})


KEY = "mm(8x4, 4x2)/float32/0123456789abcdef"


_OK = {"M": 4, "K": 4, "N": 4}
BAD_SUITES = {
    "list_of_numbers": [1, 2],
    "bool_dimension": [{"M": True, "K": 4, "N": 4}],
    "float_dimension": [{**_OK, "M": 4.0}],
    "string_dimension": [{**_OK, "K": "64"}],
    "negative_dimension": [{**_OK, "N": -1}],
    "missing_dimension": [{"M": 4, "K": 4}],
    "null_shape": [None],
    "shape_is_a_list": {"shapes": [[4, 4, 4]]},
    "shapes_is_a_string": {"shapes": "square"},
    "no_shapes": {"description": "nothing"},
    "empty_list": [],
    "json_string": "square-1024",
    "json_number": 3,
    "unknown_op": [{**_OK, "op": "conv"}],
    "op_not_a_string": [{**_OK, "op": 1}],
    "dtype_not_a_string": [{**_OK, "dtype": 5}],
    "unsupported_dtype": [{**_OK, "dtype": "int8"}],
    "unknown_b_layout": [{**_OK, "b_layout": "diag"}],
    "zero_batch": [{**_OK, "op": "bmm", "batch": 0}],
    "bool_batch": [{**_OK, "op": "bmm", "batch": False}],
    "name_not_a_string": [{**_OK, "name": ["x"]}],
    "misspelt_key": [{**_OK, "dtyp": "float64"}],
}


@pytest.mark.parametrize("command", ["tune", "sweep"])
@pytest.mark.parametrize("case", sorted(BAD_SUITES))
def test_a_malformed_suite_is_one_line_and_exit_2(tmp_path, capsys, case, command):
    from gemmtune.cli import main

    path = tmp_path / "suite.json"
    path.write_text(json.dumps(BAD_SUITES[case]))
    extra = ["--out", str(tmp_path / "d.jsonl")] if command == "sweep" else ["--store", "off"]
    assert main([command, "--suite", str(path), "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gemmtune: error: --suite: ") and str(path) in err[0], err
    assert "internal error" not in err[0]


@pytest.mark.parametrize("content", [b"{", b"\xff\xfe\x00garbage", None])
def test_an_unreadable_suite_file_is_one_line_and_exit_2(tmp_path, capsys, content):
    from gemmtune.cli import main

    path = tmp_path / "suite.json"
    if content is not None:  # None: no such file
        path.write_bytes(content)
    assert main(["tune", "--suite", str(path), "--device", "cpu", "--store", "off"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gemmtune: error: --suite: cannot read"), err


def _export_file(tmp_path: Path) -> Path:
    """A valid `gemmtune cache export` file of one pick."""

    path = tmp_path / "picks.json"
    env = {"device": "cpu", "torch": "x"}
    pick = {"template": "aten_mm", "src_hash": None, "config": {}, "runtime_params": {}, "ms": 1.0}
    path.write_text(json.dumps({"format": "gemmtune-store/1", "entries": [
        {"problem": "mm(8x4, 4x2)/float32/0123456789abcdef", "env": env, "pick": pick,
         "timings": [{**pick, "status": "ok"}]}]}))
    return path


@pytest.mark.parametrize("action", ["import", "clear"])
@pytest.mark.parametrize("kind", ["foreign_database", "unusable_directory"])
def test_a_cache_change_that_cannot_persist_exits_2_not_into_memory(tmp_path, capsys, kind, action):
    from gemmtune.cli import main

    picks = _export_file(tmp_path)
    if kind == "foreign_database":
        target = tmp_path / "app.db"
        db = sqlite3.connect(target)
        db.execute("CREATE TABLE users(name TEXT)")
        db.commit()
        db.close()
        before = hashlib.sha256(target.read_bytes()).hexdigest()
    else:
        target = picks / "store.db"  # its directory is a file
    capsys.readouterr()
    assert main(["cache", "--store", str(target), action, *([str(picks)] if action == "import" else ["--yes"])]) == 2
    out, err = capsys.readouterr()
    assert ":memory:" not in out + err and "imported" not in out
    lines = err.strip().splitlines()
    # A store whose directory is a file is refused by the --store check, before anything is opened.
    expect = "argument --store: directory" if kind == "unusable_directory" else f"cache {action}: nothing was changed: "
    assert len(lines) == 1 and lines[0].startswith(f"gemmtune: error: {expect}"), lines
    if kind == "foreign_database":
        assert "is not a gemmtune store" in lines[0]
        assert hashlib.sha256(target.read_bytes()).hexdigest() == before


def test_a_cache_import_into_a_new_store_persists(tmp_path, capsys):
    from gemmtune.cli import main
    from gemmtune.store.sqlite import Store

    picks = _export_file(tmp_path)
    assert main(["cache", "--store", str(tmp_path / "new.db"), "import", str(picks)]) == 0
    assert "imported 1 picks into" in capsys.readouterr().out
    assert len(Store(tmp_path / "new.db").problems()) == 1
