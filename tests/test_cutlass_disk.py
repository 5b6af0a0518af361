"""Compiled CUTLASS kernels on disk: a later process loads what an earlier one compiled.

The logic (names, atomic writes, a bad file compiled again, the switch) runs here with a stand-in
kernel; the round trip through the DSL's own export and loader, with a real operator, runs on the
H200 (tests/gpu/test_cutlass_operators_gpu.py::test_a_kernel_kept_on_disk_runs_right_in_a_later_process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gemmtune.templates.cutlass import disk


class Kernel:
    """A stand-in for the DSL's compiled function: `export_to_c` writes an object file."""

    def __init__(self, payload: bytes = b"object"):
        self.payload, self.exports = payload, 0

    def export_to_c(self, file_path: str, file_name: str, function_prefix: str) -> None:
        self.exports += 1
        assert function_prefix == disk.PREFIX
        Path(file_path, file_name + ".o").write_bytes(self.payload)
        Path(file_path, file_name + ".h").write_text("/* header */")


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GEMMTUNE_CUTLASS_DISK", raising=False)
    return tmp_path


def test_the_name_depends_on_everything_the_binary_does(root):
    base = disk.kernel_path(("cfg", "bf16"), "src1", "sm_90a")
    assert base.parent == root / "cutedsl_kernels"
    assert base == disk.kernel_path(("cfg", "bf16"), "src1", "sm_90a")
    others = {disk.kernel_path(("cfg", "fp16"), "src1", "sm_90a"), disk.kernel_path(("cfg", "bf16"), "src2", "sm_90a"),
              disk.kernel_path(("cfg", "bf16"), "src1", "sm_100a")}
    assert base not in others and len(others) == 3


def test_a_compiled_kernel_is_kept_whole_and_only_the_object_file(root, monkeypatch):
    monkeypatch.setattr(disk, "load", lambda path: None)  # nothing loads here: every call compiles
    kernel = Kernel()
    assert disk.load_or_compile(("k",), "src", "sm_90a", lambda: kernel) is kernel
    kept = disk.kernel_path(("k",), "src", "sm_90a")
    assert kept.read_bytes() == b"object" and kernel.exports == 1
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept.name]  # no header, no temporary left


def test_a_kept_kernel_is_loaded_instead_of_compiled(root, monkeypatch):
    path = disk.kernel_path(("k",), "src", "sm_90a")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"object")
    loaded = object()
    monkeypatch.setattr(disk, "load", lambda p: loaded if p == path else None)
    compiled = []
    assert disk.load_or_compile(("k",), "src", "sm_90a", lambda: compiled.append(1)) is loaded
    assert compiled == []


def test_a_file_that_does_not_load_is_compiled_again_and_replaced(root, caplog):
    path = disk.kernel_path(("k",), "src", "sm_90a")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an object file")
    kernel = Kernel(b"fresh")
    with caplog.at_level("INFO", logger="gemmtune"):
        assert disk.load_or_compile(("k",), "src", "sm_90a", lambda: kernel) is kernel
    assert path.read_bytes() == b"fresh"
    assert "did not load" in caplog.text


def test_a_kernel_that_fails_to_export_is_still_used(root, caplog):
    class NoExport:
        def export_to_c(self, *args):
            raise RuntimeError("export not supported")

    kernel = NoExport()
    with caplog.at_level("INFO", logger="gemmtune"):
        assert disk.load_or_compile(("k",), "src", "sm_90a", lambda: kernel) is kernel
    assert not disk.kernel_path(("k",), "src", "sm_90a").exists() and "not kept on disk" in caplog.text


def test_without_a_source_hash_or_with_the_disk_off_it_only_compiles(root, monkeypatch):
    kernel = Kernel()
    assert disk.load_or_compile(("k",), None, "sm_90a", lambda: kernel) is kernel
    monkeypatch.setenv("GEMMTUNE_CUTLASS_DISK", "0")
    assert disk.load_or_compile(("k",), "src", "sm_90a", lambda: kernel) is kernel
    assert kernel.exports == 0 and not (root / "cutedsl_kernels").exists()


def test_the_switch_reads_like_the_settings_booleans(monkeypatch):
    from gemmtune.core.errors import SettingsError

    for raw, on in (("", True), ("off", False), ("ON", True), ("0", False)):
        monkeypatch.setenv("GEMMTUNE_CUTLASS_DISK", raw)
        assert disk.enabled() is on
    monkeypatch.setenv("GEMMTUNE_CUTLASS_DISK", "nope")
    with pytest.raises(SettingsError, match="nope"):
        disk.enabled()
