"""A GPU worker reads the ptxas whose version the caller's Triton cache keys carry.

Triton keys compiled binaries with `ptxas --version`, read once per process.  When a program runs
`torch.compile` before tuning, Inductor points TRITON_PTXAS_PATH at torch's own ptxas after the
caller's Triton may have read its bundled one; a worker started then must not key its cache with
another version, or it compiles again every binary the caller built.  These tests run Triton's own
version function with its bundled ptxas and a stand-in for torch's (no GPU needed)."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from gemmtune.measure import process

compiler = pytest.importorskip("triton.backends.nvidia.compiler")


@pytest.fixture
def hopper(monkeypatch, tmp_path):
    """A Hopper device as far as the worker's environment goes, Triton's version cache empty before and
    after, and a stand-in ptxas of another version; yields its path."""
    bundled = os.path.join(os.path.dirname(compiler.__file__), "bin", "ptxas")
    if not os.access(bundled, os.X_OK):
        pytest.skip("Triton's bundled ptxas is not here")
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 99.0, V99.0.0'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(fake))
    compiler.get_ptxas_version.cache_clear()
    if "99.0" not in compiler.get_ptxas_version(90):  # e.g. Triton 3.9 reads another ptxas for sm_90
        compiler.get_ptxas_version.cache_clear()
        pytest.skip("this Triton does not key sm_90 binaries with TRITON_PTXAS_PATH's ptxas (checked with 3.6)")
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    compiler.get_ptxas_version.cache_clear()
    yield str(fake)
    compiler.get_ptxas_version.cache_clear()


def test_keys_made_with_the_bundled_ptxas_send_the_worker_to_the_bundled_one(hopper, monkeypatch):
    keyed = compiler.get_ptxas_version(90)  # the caller keyed its binaries before the path was set
    monkeypatch.setenv("TRITON_PTXAS_PATH", hopper)  # then torch.compile set it
    env = process._worker_env("cuda:0")
    assert "TRITON_PTXAS_PATH" not in env
    assert "99.0" not in keyed and os.environ["TRITON_PTXAS_PATH"] == hopper  # the caller's own env is untouched


def test_keys_made_with_the_configured_ptxas_keep_it(hopper, monkeypatch):
    monkeypatch.setenv("TRITON_PTXAS_PATH", hopper)
    assert "99.0" in compiler.get_ptxas_version(90)
    assert process._worker_env("cuda:0")["TRITON_PTXAS_PATH"] == hopper


def test_nothing_keyed_yet_leaves_the_path_as_it_is(hopper, monkeypatch):
    monkeypatch.setenv("TRITON_PTXAS_PATH", hopper)
    assert process._worker_env("cuda:0")["TRITON_PTXAS_PATH"] == hopper
    assert compiler.get_ptxas_version.cache_info().currsize == 0  # the worker's env did not key anything
