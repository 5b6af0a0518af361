"""The `cutlass_operators` template wired into gemmtune: the registry pools it only where it runs (one
log line where not), only a `backends` naming "cutlass" selects it, a tune compiles its operators in
compile processes and keeps them on disk, and the store's checks and `simulate` know its uid.

The compile processes import a fake `cutlass` package (written to a temporary folder put first on
sys.path; `cutlass.operators` shaped like nvidia-cutlass-operators 0.3's API, `cutlass.runtime`'s
`load_module` reading what the fake `export_to_c` wrote), so they run here without the library."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys

import pytest
import torch

import gemmtune
from gemmtune.core.choices import Choice, as_params
from gemmtune.core.inputs import KernelInputs
from gemmtune.core.settings import Settings
from gemmtune.measure.compile import precompile
from gemmtune.templates.cutlass import compile_process, parallel
from gemmtune.templates.cutlass import operators as tmod
from gemmtune.templates.cutlass.operators import CutlassOperatorsTemplate
from gemmtune.templates.registry import active_templates, default_templates, optional_templates, skipped_note

FAKE_OPERATORS = '''
import json, os, time, types

__version__ = "0.3.0"
COMPILE_S = 0.02
COMPILES = []  # the pid of each compile run in this process
RUNNING = [0, 0]  # compiles running now, the most that ever ran at once


class Design(types.SimpleNamespace):
    def __repr__(self):
        return f"BLASDesignMetadata(tile_shape={self.tile_shape}, cluster_shape={self.cluster_shape})"


class Compiled:
    def __init__(self, design, start):
        self.design, self.pid, self.start, self.end = repr(design), os.getpid(), start, time.time()

    def export_to_c(self, path, function_name):
        with open(path, "w") as f:
            json.dump({"design": self.design, "pid": self.pid, "start": self.start, "end": self.end}, f)


class Sm90StaticPersistentGemmOperator:
    def __init__(self, tile, cluster):
        self.metadata = types.SimpleNamespace(design=Design(tile_shape=tile, cluster_shape=cluster, num_smem_stages=None))

    def compile(self, args, target_sm=None):
        if os.environ.get("GEMMTUNE_WORKER_PROCESS") == "1" and os.environ.get("FAKE_CUTLASS_CHILD_FAILS"):
            raise RuntimeError("this compile process cannot compile")
        start = time.time()
        RUNNING[0] += 1
        RUNNING[1] = max(RUNNING)
        time.sleep(COMPILE_S)
        RUNNING[0] -= 1
        COMPILES.append(os.getpid())
        return CompiledArtifact(Compiled(self.metadata.design, start), self, target_sm)

    def run(self, args, compiled_artifact=None, stream=None, workspace=None, assume_supported_args=False):
        assert compiled_artifact.operator_obj is self
        args.out.copy_(args.A.float() @ args.B.float())


class GlobalOptions:
    use_tvm_ffi = True


class CompiledArtifact:
    def __init__(self, compiled_obj, operator_obj, compiled_for):
        self.compiled_obj, self.operator_obj, self.compiled_for = compiled_obj, operator_obj, compiled_for


TargetSm = str


def GemmArguments(A, B, out, accumulator_type, epilogue=None):
    return types.SimpleNamespace(A=A, B=B, out=out, accumulator_type=accumulator_type, epilogue=epilogue)


def EpilogueArguments(fn, **kw):
    return types.SimpleNamespace(fn=fn, kw=kw)


def get_operators(args, target_sm=None):
    if args.epilogue is not None:  # as on Hopper: no operator fuses an epilogue
        return []
    return [Sm90StaticPersistentGemmOperator((m, n, 64), (cm, cn, 1))
            for m in (64, 128) for n in (64, 128, 256) for cm in (1, 2) for cn in (1, 2)]
'''

FAKE_RUNTIME = '''
import json, types


def load_module(path, enable_tvm_ffi=False):
    with open(path) as f:
        kept = json.load(f)
    return types.SimpleNamespace(gemmtune_operator=types.SimpleNamespace(loaded_from=path, **kept))
'''

A, W = torch.randn(64, 32), torch.randn(48, 32)


@pytest.fixture
def fresh_reasons():
    tmod.unavailable_reason.cache_clear()
    yield
    tmod.unavailable_reason.cache_clear()


@pytest.fixture
def fake_lib(tmp_path, monkeypatch):
    """The fake `cutlass.operators`, importable here and in compile processes; the cache in tmp_path."""
    pkg = tmp_path / "fake" / "cutlass"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "operators.py").write_text(FAKE_OPERATORS)
    (pkg / "runtime.py").write_text(FAKE_RUNTIME)
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "cutlass" or k.startswith("cutlass.")}
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUTE_DSL_CACHE_DIR", str(tmp_path / "cutedsl"))
    import cutlass.operators as lib

    yield lib
    for k in [k for k in sys.modules if k == "cutlass" or k.startswith("cutlass.")]:
        del sys.modules[k]
    sys.modules.update(saved)


def _on_gpu(ki: KernelInputs) -> KernelInputs:
    """`ki` as if its tensors were on cuda:0 (nothing runs: for pool selection only)."""
    return dataclasses.replace(ki, operands=tuple(dataclasses.replace(t, device="cuda:0") for t in ki.operands))


def _as_on_hopper(monkeypatch) -> None:
    monkeypatch.setattr(tmod, "library_importable", lambda: True)
    monkeypatch.setattr(tmod, "hopper_gpu_reason", lambda: None)


def _skip_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "cutlass_operators template skipped" in r.getMessage()]


# -- the registry ---------------------------------------------------------------------------

def test_without_the_library_it_is_left_out_with_one_log_line(fresh_reasons, monkeypatch, caplog):
    monkeypatch.setattr(tmod, "library_importable", lambda: False)
    caplog.set_level(logging.INFO, logger="gemmtune.templates.cutlass")
    for _ in range(3):
        assert "cutlass_operators" not in [t.uid for t in default_templates()]
    lines = _skip_lines(caplog)
    assert len(lines) == 1 and "nvidia-cutlass-operators is not installed" in lines[0], lines
    assert "cutlass_operators" in [t.uid for t in optional_templates()]  # shipped, usable here or not


def test_without_a_hopper_gpu_it_is_left_out_naming_why(fresh_reasons, monkeypatch, caplog):
    monkeypatch.setattr(tmod, "library_importable", lambda: True)
    monkeypatch.setattr(tmod, "hopper_gpu_reason", lambda: "compute capability 8.0 < 9.0")
    caplog.set_level(logging.INFO, logger="gemmtune.templates.cutlass")
    assert "cutlass_operators" not in [t.uid for t in default_templates()]
    assert _skip_lines(caplog) == ["cutlass_operators template skipped: compute capability 8.0 < 9.0"]


def test_with_the_library_on_hopper_it_joins_the_pool(fresh_reasons, monkeypatch, caplog):
    _as_on_hopper(monkeypatch)
    caplog.set_level(logging.INFO, logger="gemmtune.templates.cutlass")
    assert [t.uid for t in default_templates()].count("cutlass_operators") == 1
    assert "cutlass_operators" not in [t.uid for t in default_templates(hopper=False)]
    assert _skip_lines(caplog) == []


@pytest.mark.parametrize("backends", [
    Settings(backends="extern,triton,cutlass").backends,
    Settings.from_env({"GEMMTUNE_BACKENDS": "extern,triton,cutlass"}).backends,
    ("cutlass",),
])
def test_a_backends_naming_cutlass_selects_it_at_any_size(fresh_reasons, monkeypatch, backends):
    _as_on_hopper(monkeypatch)
    monkeypatch.setattr(CutlassOperatorsTemplate, "supports", lambda self, ki: True)  # as on a Hopper GPU
    ki = _on_gpu(KernelInputs.from_tensors("mm", A.bfloat16(), W.t().bfloat16()))
    pool = [t for t in default_templates() if t.family != "triton"]  # Triton's supports() asks a real GPU
    assert "cutlass" in backends and "cutlass_operators" in [t.uid for t in pool]
    assert "cutlass_operators" in [t.uid for t in active_templates(ki, backends, pool)]
    assert "cutlass_operators" not in [t.uid for t in active_templates(ki, ("extern", "triton"), pool)]


@pytest.mark.parametrize("m, n, k, pooled", [
    (64, 48, 32, False), (2047, 4096, 4096, False), (4096, 2047, 4096, False), (4096, 4096, 2047, False),
    (2048, 2048, 2048, True), (4097, 4096, 4096, True), (8192, 8192, 8192, True),
])
def test_the_default_pool_has_it_for_large_problems_only(fresh_reasons, monkeypatch, m, n, k, pooled):
    _as_on_hopper(monkeypatch)
    monkeypatch.setattr(CutlassOperatorsTemplate, "supports", lambda self, ki: True)
    a, b = torch.empty(m, k, dtype=torch.bfloat16), torch.empty(n, k, dtype=torch.bfloat16).t()
    ki = _on_gpu(KernelInputs.from_tensors("mm", a, b))
    pool = [t for t in default_templates() if t.family != "triton"]
    uids = [t.uid for t in active_templates(ki, None, pool)]
    assert ("cutlass_operators" in uids) is pooled


def test_naming_cutlass_where_it_cannot_run_names_cutlass_operators_and_why(fresh_reasons, monkeypatch):
    monkeypatch.setattr(tmod, "library_importable", lambda: False)
    assert "; cutlass_operators: nvidia-cutlass-operators is not installed" in skipped_note(("cutlass",))
    assert "cutlass_operators" not in skipped_note(("extern", "triton"))
    with pytest.raises(gemmtune.NoCandidatesError, match=r"cutlass_operators: nvidia-cutlass-operators is not installed"):
        gemmtune.tune("mm", torch.randn(8, 16), torch.randn(16, 8), backends=("cutlass",))


# -- compile processes and the disk ----------------------------------------------------------

def _kept(tmp_path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "cache" / "cutedsl_kernels").glob("*.o"))]


def test_a_tune_compiles_the_operators_in_compile_processes_and_keeps_them_on_disk(fake_lib, tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "workers", lambda: 2)  # as on a machine of four cores or more
    t = CutlassOperatorsTemplate(library=fake_lib, target="90a")
    ki = KernelInputs.from_tensors("mm", A, W.t())
    choices = t.configs(ki)
    assert len(choices) == 24 >= parallel.MIN_BATCH
    result = precompile(choices, {t.uid: t}, ki, (A, W.t()), timeout_s=300)
    assert len(result.launchers) == 24 and not result.failures
    assert fake_lib.COMPILES == []  # every kernel was compiled elsewhere and loaded here
    kept = _kept(tmp_path)
    assert len(kept) == 24 and len({k["design"] for k in kept}) == 24
    assert len({k["pid"] for k in kept}) == 2 and os.getpid() not in {k["pid"] for k in kept}
    assert result.seconds >= max(k["end"] for k in kept) - min(k["start"] for k in kept)  # counted in compile_s
    torch.testing.assert_close(result.launchers[choices[5].binary_key]((A, W.t())), A @ W.t())

    started = []
    monkeypatch.setattr(parallel, "start", lambda jobs, **kw: started.append(jobs) or 0)
    again = precompile(choices, {t.uid: t}, ki, (A, W.t()), timeout_s=300)  # a later tune: all on disk
    assert len(again.launchers) == 24 and started == [] and fake_lib.COMPILES == []


def test_a_compile_process_that_fails_leaves_the_compile_to_the_caller(fake_lib, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(parallel, "workers", lambda: 2)
    monkeypatch.setenv("FAKE_CUTLASS_CHILD_FAILS", "1")
    caplog.set_level(logging.INFO, logger="gemmtune.templates.cutlass")
    t = CutlassOperatorsTemplate(library=fake_lib, target="90a")
    ki = KernelInputs.from_tensors("mm", A, W.t())
    result = precompile(t.configs(ki), {t.uid: t}, ki, (A, W.t()), timeout_s=300)
    assert len(result.launchers) == 24 and not result.failures
    assert fake_lib.COMPILES == [os.getpid()] * 24
    assert {k["pid"] for k in _kept(tmp_path)} == {os.getpid()}  # kept by the caller for the next process
    assert any("this compile process cannot compile; compiling here" in r.getMessage() for r in caplog.records)


def test_one_compile_process_at_most_compiles_in_the_caller_and_keeps_them(fake_lib, tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "workers", lambda: 1)  # the 2-core machine: half its cores
    t = CutlassOperatorsTemplate(library=fake_lib, target="90a")
    ki = KernelInputs.from_tensors("mm", A, W.t())
    result = precompile(t.configs(ki), {t.uid: t}, ki, (A, W.t()), timeout_s=300, workers=4)
    assert len(result.launchers) == 24 and fake_lib.COMPILES == [os.getpid()] * 24
    assert len(_kept(tmp_path)) == 24
    assert fake_lib.RUNNING[1] == 1  # four compile threads, one library compile at a time (the DSL's tracing)


def test_a_job_of_an_unknown_kind_is_answered_with_why():
    assert compile_process.compile_one({"kind": "nope", "path": "x"}) == "KeyError: 'nope'"


# -- the store's checks and simulate ------------------------------------------------------------

def test_the_store_knows_the_uid_and_that_it_has_no_runtime_parameter():
    from gemmtune.store.schema import unknown_templates

    cfg = dict(operator="Sm90StaticPersistentGemmOperator", tile_m=128, tile_n=256, tile_k=64, cluster_m=2,
               cluster_n=1, stages=0, epilogue="none")
    key = "mm(4096x4096, 4096x4096)/bfloat16/0123456789abcdef"
    pin = {"template": "cutlass_operators", "src_hash": "h", "config": cfg, "runtime_params": {}}
    assert unknown_templates({key: [pin]}, "t.json") == []
    with pytest.warns(RuntimeWarning):
        why = unknown_templates({key: [{**pin, "runtime_params": {"swizzle": 8}}]}, "t.json")
        odd = unknown_templates({key: [{**pin, "config": {**cfg, "tile_m": "128"}}]}, "t.json")
    assert len(why) == 1 and "no runtime parameter 'swizzle' (has: none)" in why[0], why
    assert len(odd) == 1 and "config values must be integers (names for operator, epilogue), got {'tile_m': '128'}" in odd[0]


def test_simulate_replays_recorded_cutlass_operators_timings():
    from gemmtune.offline.dataset import ReplayShape
    from gemmtune.offline.simulate import StrategySpec, default_specs, simulate

    times = {}
    for i, (m, n) in enumerate([(64, 64), (128, 128), (128, 256), (64, 256)]):
        cfg = dict(operator="Sm90StaticPersistentGemmOperator", tile_m=m, tile_n=n, tile_k=64, cluster_m=1,
                   cluster_n=1, stages=0, epilogue="none")
        times[Choice("cutlass_operators", f"h{i}", as_params(cfg), as_params({}), family="cutlass")] = (1.3, 1.1, 1.0, 1.2)[i]
    times[Choice("aten_mm", None)] = 1.05
    shape = ReplayShape((4096, 4096, 4096), times, "ops", {c.binary_key: 2.0 for c in times if not c.is_extern})
    report = simulate([shape], [StrategySpec("exhaustive", "exhaustive"), *default_specs([shape])[-1:]])
    for result in report.strategies:
        (r,) = result.per_shape
        assert r.winner.startswith("cutlass_operators_") and "tile_m128_tile_n256" in r.winner, (result.name, r.winner)
        assert r.regret_pct == 0.0


def test_the_template_compiles_under_the_dsls_one_lock():
    """Two DSL kernels must never trace at once in one process (the DSL is not thread-safe)."""
    from gemmtune.templates.cutlass import operators_lib, tracing

    assert operators_lib._COMPILE_LOCK is tracing.DSL_COMPILE_LOCK
