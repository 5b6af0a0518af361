"""The `cutlass_hopper` template on a CPU-only machine: skipped with one log line, never an error;
its src_hash, shared-memory fit, config space, runtime space and tile order (docs/CUTLASS.md).

The DSL compile itself is exercised by bench/cutlass_compile.py (needs nvidia-cutlass-dsl); the
kernel's numerics by tests/gpu/test_cutlass_gpu.py."""

from __future__ import annotations

import itertools
import dataclasses
import logging

import pytest
import torch

import gemmtune
from gemmtune.core.inputs import KernelInputs
from gemmtune.core.settings import FAMILIES
from gemmtune.templates.cutlass import hopper
from gemmtune.templates.cutlass.hopper import (CutlassHopperTemplate, config_space, fit_configs, fits,
                                               kernel_src_hash, smem_bytes, tma_layout)
from gemmtune.templates.cutlass.order import tile_order
from gemmtune.templates.registry import default_templates


@pytest.fixture
def fresh_reason():
    hopper.unavailable_reason.cache_clear()
    yield
    hopper.unavailable_reason.cache_clear()


def _ki(op="mm", m=64, n=64, k=64, dtype=torch.bfloat16):
    a, w = torch.ones(m, k, dtype=dtype), torch.ones(n, k, dtype=dtype)
    return KernelInputs.from_tensors(op, a, w.t()) if op == "mm" else KernelInputs.from_tensors(op, torch.ones(n, dtype=dtype), a, w.t())


def test_skipped_with_one_log_line_when_the_dsl_is_absent(fresh_reason, monkeypatch, caplog):
    monkeypatch.setattr(hopper, "dsl_version", lambda: None)
    caplog.set_level(logging.INFO, logger="gemmtune.templates.cutlass")
    t = CutlassHopperTemplate()
    assert not t.available() and not t.supports(_ki()) and not t.supports(_ki("addmm"))
    assert [t.uid for t in default_templates()].count("cutlass_hopper") == 0
    lines = [r.getMessage() for r in caplog.records
             if r.name == "gemmtune.templates.cutlass" and r.getMessage().startswith("cutlass_hopper ")]
    assert len(lines) == 1 and "nvidia-cutlass-dsl is not installed" in lines[0], lines  # cutlass_operators logs its own


def test_without_a_hopper_gpu_or_validation_the_reason_says_which(fresh_reason, monkeypatch):
    monkeypatch.setattr(hopper, "dsl_importable", lambda: True)
    monkeypatch.setattr(hopper, "_hopper_gpu", lambda: "no CUDA device")
    assert hopper.unavailable_reason() == "no CUDA device"
    hopper.unavailable_reason.cache_clear()
    monkeypatch.setattr(hopper, "_hopper_gpu", lambda: None)
    assert hopper.unavailable_reason() is None and CutlassHopperTemplate().available()  # validated on an H200
    hopper.unavailable_reason.cache_clear()
    monkeypatch.setattr(hopper, "KERNEL_VALIDATED", False)  # a kernel change awaiting the GPU tests
    assert hopper.unavailable_reason() == hopper.NOT_VALIDATED
    assert not CutlassHopperTemplate().available() and CutlassHopperTemplate(require_validation=False).available()


def test_opt_in_family_only_a_backends_naming_it_pools_it(fresh_reason, monkeypatch):
    from gemmtune.templates.registry import active_templates

    monkeypatch.setattr(hopper, "dsl_importable", lambda: True)
    monkeypatch.setattr(hopper, "_hopper_gpu", lambda: None)
    monkeypatch.setattr(CutlassHopperTemplate, "supports", lambda self, ki: True)  # as on a Hopper GPU
    ki = _ki()
    ki = dataclasses.replace(ki, operands=tuple(dataclasses.replace(t, device="cuda:0") for t in ki.operands))  # GPU
    t = CutlassHopperTemplate()
    assert "cutlass_hopper" not in [x.uid for x in active_templates(ki, None, [t])]
    assert [x.uid for x in active_templates(ki, ("extern", "cutlass"), [t])] == ["cutlass_hopper"]


def test_cpu_problems_are_never_supported_and_tuning_still_works():
    t = CutlassHopperTemplate(require_validation=False)
    assert not t.supports(_ki())  # CPU tensors
    a, b = torch.randn(8, 16), torch.randn(16, 8)
    torch.testing.assert_close(gemmtune.mm(a, b), a @ b)


def test_src_hash_covers_kernel_source_and_dsl_version(monkeypatch):
    assert CutlassHopperTemplate.src_hash == kernel_src_hash(hopper.dsl_version())  # None here: "==None"
    assert kernel_src_hash("4.8.1") != kernel_src_hash("4.8.2")
    monkeypatch.setattr(hopper, "dsl_version", lambda: "4.8.1")
    assert kernel_src_hash() == kernel_src_hash("4.8.1")


def test_family_is_known_and_the_template_is_described():
    t = CutlassHopperTemplate()
    assert "cutlass" in FAMILIES and (t.uid, t.family) == ("cutlass_hopper", "cutlass")
    assert dict(t.runtime_space) == {"swizzle": (1, 2, 4, 8), "raster": ("m", "n")}
    assert t.default_runtime == {"swizzle": 8, "raster": "n"}  # chosen on the H200 sweep (docs/CUTLASS.md)
    choices = t.configs(_ki())
    assert len(choices) == 8 * len(t.compile_configs(_ki()))
    assert len({c.binary_key for c in choices}) == len(t.compile_configs(_ki()))  # runtime shares a binary


def test_smem_fit_filter():
    assert smem_bytes(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, stages=4) == 4 * (256 * 64 * 2 + 16) + 1024
    space = config_space()
    assert space and all(fits(c) for c in space)
    full = list(itertools.product((64, 128), (64, 128, 256), range(2, 7), hopper.CLUSTERS))
    dropped = [(bm, bn, s) for bm, bn, s, _ in full
               if not fits(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, stages=s))]
    assert (128, 256, 6) in dropped and (128, 256, 5) in dropped and (128, 256, 4) not in dropped
    assert len(space) == len(full) - len(dropped)
    small = config_space(smem_limit=100_000)
    assert small and all(smem_bytes(**c) <= 100_000 for c in small) and len(small) < len(space)


def test_fit_configs_clamp_tiles_and_clusters():
    space = config_space()
    fitted = fit_configs(space, 16, 64)
    assert {(c["BLOCK_M"], c["BLOCK_N"], c["cluster_m"], c["cluster_n"]) for c in fitted} == {(64, 64, 1, 1)}
    big = fit_configs(space, 4096, 4096)
    assert len(big) == len(space)


def test_tma_layout_reads_both_b_layouts():
    a = torch.ones(5, 64, dtype=torch.float16)
    assert tma_layout(KernelInputs.from_tensors("mm", a, torch.ones(64, 24, dtype=torch.float16))) == "n"
    assert tma_layout(KernelInputs.from_tensors("mm", a, torch.ones(24, 64, dtype=torch.float16).t())) == "k"
    assert tma_layout(KernelInputs.from_tensors("mm", a, torch.ones(64, 20, dtype=torch.float16))) is None  # 40-byte rows


@pytest.mark.parametrize("tiles_m,tiles_n", [(1, 1), (3, 5), (8, 2), (7, 7)])
@pytest.mark.parametrize("swizzle", [1, 2, 4, 8])
@pytest.mark.parametrize("raster", [0, 1])
def test_tile_order_is_a_permutation(tiles_m, tiles_n, swizzle, raster):
    tiles = [tile_order(i, tiles_m, tiles_n, swizzle, raster) for i in range(tiles_m * tiles_n)]
    assert sorted(tiles) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]


def test_tile_order_rasters():
    assert [tile_order(i, 2, 3, 1, 0) for i in range(3)] == [(0, 0), (0, 1), (0, 2)]  # swizzle 1: N along a row
    assert [tile_order(i, 2, 3, 1, 1) for i in range(2)] == [(0, 0), (1, 0)]  # raster n, swizzle 1: M first
    assert [tile_order(i, 4, 4, 2, 0) for i in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [tile_order(i, 4, 4, 2, 1) for i in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_naming_cutlass_where_it_cannot_run_says_why(fresh_reason, monkeypatch):
    monkeypatch.setattr(hopper, "dsl_version", lambda: None)
    a, b = torch.randn(8, 16), torch.randn(16, 8)
    with pytest.raises(gemmtune.NoCandidatesError, match=r"cutlass_hopper: nvidia-cutlass-dsl is not installed"):
        gemmtune.tune("mm", a, b, backends=("cutlass",))
    hopper.unavailable_reason.cache_clear()
    monkeypatch.setattr(hopper, "dsl_importable", lambda: True)
    monkeypatch.setattr(hopper, "_hopper_gpu", lambda: "no CUDA device")
    with pytest.raises(gemmtune.NoCandidatesError, match=r"cutlass_hopper: no CUDA device"):
        gemmtune.tune("mm", a, b, backends=("cutlass",))
