"""GPU tests of the `cutlass_operators` template (nvidia-cutlass-operators); skipped without CUDA, a
Hopper GPU or the library.

Run:  python -m pytest -q -s tests/gpu/test_cutlass_operators_gpu.py  (on the GPU machine, carrying
.whl/cutlass: `python bench/gpu_run.py cutlass-setup,tests-cutlass` sets the library up and runs this file)
"""

import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import gemmtune
from gemmtune.core.inputs import KernelInputs
from gemmtune.measure.correctness import check, reference
from gemmtune.templates.cutlass.operators import CutlassOperatorsTemplate, library_importable
from gpu_operands import operands

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
pytestmark = pytest.mark.skipif(not (HOPPER and library_importable()),
                                reason="needs a Hopper GPU and nvidia-cutlass-operators")
# a few designs of each operator class keep the compile time of a run short
KEEP = dict(tile_m=(128,), tile_n=(128, 256))


def some_choices(template, ki, limit=6):
    picked = [c for c in template.configs(ki) if all(c.config_dict.get(k, v[0]) in v for k, v in KEEP.items())]
    return picked[:limit]


def check_choices(op, tensors, alpha=1.0, beta=1.0):
    template = CutlassOperatorsTemplate()
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    assert template.supports(ki), ki.describe()
    ref = reference(ki, tensors)
    for c in some_choices(template, ki):
        t0 = time.perf_counter()
        launch = template.compile(c, ki, tensors)
        print(f"\n{ki.describe()} {dict(c.config)}: compiled in {time.perf_counter() - t0:.2f} s")
        out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype, device="cuda")
        launch(tensors, out)
        torch.cuda.synchronize()
        assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))


@pytest.mark.parametrize("b_layout", ["col", "row"])
@pytest.mark.parametrize("M,K,N", [(333, 264, 520), (1000, 1032, 776)])
def test_mm_numerics(b_layout, M, K, N):
    check_choices("mm", operands("mm", M, K, N, torch.bfloat16, b_layout))


def test_addmm_bias_alpha_beta_numerics():
    check_choices("addmm", operands("addmm", 333, 264, 520, torch.bfloat16, "col"), alpha=0.5, beta=2.0)


def test_bmm_numerics():
    check_choices("bmm", operands("bmm", 200, 136, 264, torch.float16, "row", batch=3))


@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_tune_picks_among_the_operators_and_the_pick_is_right(op, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path))
    tensors = operands(op, 1024, 512, 768, torch.bfloat16, "col")
    template = CutlassOperatorsTemplate()
    sel = gemmtune.tune(op, *tensors, backends=("cutlass",), templates=[template])
    assert sel.winner.template_uid == "cutlass_operators", sel.winner
    ok = [t for t in sel.timings if t.status == "ok"]
    assert len(ok) >= 10, [(t.choice.key, t.status) for t in sel.timings][:5]
    ki = KernelInputs.from_tensors(op, *tensors)
    out = sel.kernel(*tensors)
    torch.cuda.synchronize()
    assert check(ki, out, reference(ki, tensors)) is None
    print(f"\n{op}: winner {dict(sel.winner.config)} of {len(ok)} timed")


def test_the_library_takes_no_runtime_parameter():
    """What the template's empty runtime_space rests on, read from the installed library."""
    import dataclasses

    import cutlass.operators as ops
    from cutlass.operators.providers.cutedsl.gemm.implementations.sm90_static_persistent_impl import (
        Sm90StaticPersistentGemmKernel)

    assert [f.name for f in dataclasses.fields(ops.PerformanceControls)] == []
    assert list(inspect.signature(ops.Operator.run).parameters) == [
        "self", "args", "compiled_artifact", "stream", "workspace", "assume_supported_args"]
    call = list(inspect.signature(Sm90StaticPersistentGemmKernel.__call__).parameters)
    assert "swizzle_size" not in call and "raster_along_m" not in call  # fixed at trace time


def test_a_kernel_kept_on_disk_runs_right_in_a_later_process(tmp_path):
    code = (
        "import torch, time, sys; sys.path.insert(0, 'tests/gpu'); from gpu_operands import operands\n"
        "from gemmtune.core.inputs import KernelInputs\n"
        "from gemmtune.measure.correctness import check, reference\n"
        "from gemmtune.templates.cutlass.operators import CutlassOperatorsTemplate\n"
        "t = CutlassOperatorsTemplate(); x = operands('mm', 512, 256, 384, torch.bfloat16, 'col')\n"
        "ki = KernelInputs.from_tensors('mm', *x); c = t.configs(ki)[0]; t0 = time.perf_counter()\n"
        "out = t.compile(c, ki, x)(x); torch.cuda.synchronize()\n"
        "print(round(time.perf_counter() - t0, 3), check(ki, out, reference(ki, x)))\n")
    runs = _twice(code, tmp_path)
    for r in runs:
        assert r.stdout.split()[-1] == "None", r.stdout
    print(f"\nfirst process {runs[0].stdout.split()[0]} s, second (from disk) {runs[1].stdout.split()[0]} s")


def _twice(code: str, cache: Path) -> list:
    """`python -c code` in two processes one after the other, sharing the cache folder `cache`: the
    second loads what the first kept on disk.  Each must succeed and the first must keep a kernel."""
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(cache)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    assert list((cache / "cutedsl_kernels").glob("*.o")), "nothing kept on disk"
    return runs


@pytest.mark.parametrize("op", ["mm", "bmm"])
def test_a_direct_kernel_call_gives_the_librarys_result(op):
    """`direct=True` (the default) calls the compiled kernel with the tensors (where the library's run
    would), after its first call: the same output, bit for bit, as the library's run on its arguments.  Host time per call of both is
    printed (a measurement, not asserted)."""
    tensors = operands("mm", 4097, 4096, 4096, torch.bfloat16, "col") if op == "mm" else \
        operands("bmm", 512, 1024, 768, torch.bfloat16, "row", batch=4)
    ki = KernelInputs.from_tensors(op, *tensors)
    outs, host = {}, {}
    for direct in (False, True):
        template = CutlassOperatorsTemplate(direct=direct)
        choice = some_choices(template, ki, limit=1)[0]
        launch = template.compile(choice, ki, tensors)
        launch(tensors)  # a direct launcher's first call is the library's run, its kernel checked against it
        outs[direct] = launch(tensors)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            launch(tensors)
        host[direct] = (time.perf_counter() - t0) / 50 * 1e6  # launches queue: host time, GPU still busy
        torch.cuda.synchronize()
    print(f"\n{ki.describe()}: host us per call, library run {host[False]:.0f}, direct {host[True]:.0f}")
    assert torch.equal(outs[False], outs[True])


def test_a_kernel_loaded_from_disk_takes_the_direct_call_once_it_agrees(tmp_path):
    """The direct call (the default) of a kernel a later process loads from disk: its first call checks
    it against the library's run (`launch.agreeing`), and it must agree there as on a fresh compile."""
    code = (
        "import torch, sys; sys.path.insert(0, 'tests/gpu'); from gpu_operands import operands\n"
        "from gemmtune.core.inputs import KernelInputs\n"
        "from gemmtune.measure.correctness import check, reference\n"
        "from gemmtune.templates.cutlass import launch as L\n"
        "from gemmtune.templates.cutlass.operators import CutlassOperatorsTemplate\n"
        "seen, real = [], L.agreeing\n"
        "L.agreeing = lambda *a: (lambda k: seen.append(k is not None) or k)(real(*a))\n"
        "t = CutlassOperatorsTemplate(); x = operands('mm', 512, 256, 384, torch.bfloat16, 'col')\n"
        "ki = KernelInputs.from_tensors('mm', *x); run = t.compile(t.configs(ki)[0], ki, x)\n"
        "outs = [run(x) for _ in range(3)]; torch.cuda.synchronize()\n"
        "print(seen, all(check(ki, o, reference(ki, x)) is None for o in outs))\n")
    for r in _twice(code, tmp_path):
        assert r.stdout.split("\n")[-2] == "[True] True", r.stdout
