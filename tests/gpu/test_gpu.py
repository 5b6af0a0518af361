"""GPU tests: run on a CUDA machine (skipped elsewhere)."""

import pytest
import torch

import gemmtune
from gemmtune.measure.correctness import check, reference
from gemmtune.core.inputs import KernelInputs
from gemmtune.measure.timers import CudaTimer
from gemmtune.templates.extern import AtenTemplate
from gemmtune.templates.triton.base import SWIZZLES
from gemmtune.templates.triton.mm import TritonMMTemplate
from gpu_operands import operands

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SPACE = [dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_stages=3, num_warps=4),
         dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=3, num_warps=8),
         dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_stages=4, num_warps=4)]


def check_all(op, tensors, alpha=1.0, beta=1.0, space=SPACE):
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    t = TritonMMTemplate(space=space)
    ref = reference(ki, tensors)
    launchers = {}
    for c in t.configs(ki):
        launch = launchers.setdefault(c.binary_key, t.compile(c, ki, tensors))
        out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype, device="cuda")
        launch(tensors, out, **c.runtime_dict)
        torch.cuda.synchronize()
        assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(1, 4096, 6144), (1000, 1000, 1000), (257, 129, 383), (16, 14336, 4096)])
def test_triton_mm_correct(dtype, b_layout, shape):
    check_all("mm", operands("mm", *shape, dtype, b_layout))


@pytest.mark.parametrize("tf32", [False, True])
def test_fp32_follows_torch_tf32_setting(tf32, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    check_all("mm", operands("mm", 300, 512, 200, torch.float32, "row"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_addmm_and_bmm(dtype):
    check_all("addmm", operands("addmm", 333, 256, 250, dtype, "col"), alpha=0.5, beta=2.0)
    bias, a, b = operands("addmm", 64, 64, 64, dtype, "row")
    check_all("addmm", (torch.full_like(bias, float("nan")), a, b), beta=0.0)
    check_all("bmm", operands("bmm", 100, 72, 130, dtype, "col", batch=5))


def test_resource_overflow_is_dropped_not_fatal():
    huge = [dict(BLOCK_M=256, BLOCK_N=256, BLOCK_K=256, num_stages=6, num_warps=8)]
    a, b = operands("mm", 1024, 1024, 1024, torch.bfloat16, "row")
    # The fitted config list drops what exceeds shared memory before compiling...
    t = TritonMMTemplate(space=huge)
    assert t.configs(KernelInputs.from_tensors("mm", a, b)) == []
    # ...and a compile that fails anyway is dropped at compile time.
    class Unfitted(TritonMMTemplate):
        def compile_configs(self, ki):
            return huge

    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), Unfitted()])
    assert {t.status for t in sel.timings if not t.choice.is_extern} == {"compile_failed"}
    assert sel.winner.template_uid == "aten_mm"


def test_tune_gpu_end_to_end_prescreen_vs_exhaustive():
    a, b = operands("mm", 2048, 2048, 2048, torch.bfloat16, "row")
    pre = gemmtune.tune("mm", a, b)
    exh = gemmtune.tune("mm", a, b, strategy="exhaustive")
    assert pre.layout.kind == "fixed" and exh.layout.kind == "fixed"
    assert pre.benchmark_runs * 2 < exh.benchmark_runs
    assert any(t.choice.is_extern and t.ms for t in pre.timings)
    torch.testing.assert_close(pre(a, b).float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1)
    text = gemmtune.autotune_table(pre)
    assert text.startswith("AUTOTUNE mm(2048x2048, 2048x2048)") and "swizzle=" in text


def test_extern_only_gpu_is_flexible_and_bias_epilogue_is_a_choice():
    bias, a, b = operands("addmm", 512, 256, 384, torch.bfloat16, "row")
    sel = gemmtune.tune("addmm", bias, a, b, backends=("extern",))
    assert sel.layout.kind == "flexible"
    assert {t.choice.template_uid for t in sel.timings} == {"aten_addmm", "aten_bias_addmm"}
    torch.testing.assert_close(sel(bias, a, b).float(), torch.addmm(bias, a, b).float(), rtol=2e-2, atol=2e-1)


def test_cuda_timer_times_and_interleaves():
    a, b = operands("mm", 4096, 4096, 4096, torch.bfloat16, "row")
    timer = CudaTimer(torch.device("cuda"))
    m = timer.time(lambda: torch.mm(a, b))
    ms, gpu, host = m.cost_ms, m.gpu_ms, m.host_ms
    assert gpu > 0 and host > 0 and ms == max(gpu, host)
    both = timer.time_interleaved([lambda: torch.mm(a, b), lambda: torch.mm(a, b)], rounds=10)
    assert len(both) == 2 and all(x.cost_ms > 0 and x.gpu_ms > 0 and x.host_ms > 0 for x in both)
    assert 0.8 < both[0].cost_ms / both[1].cost_ms < 1.25  # the same kernel, interleaved


def test_host_launch_cost_counts_for_tiny_problems():
    # A 16x16x16 mm takes ~2 us on the GPU; its cost to an eager caller is the host launch.
    a, b = operands("mm", 16, 16, 16, torch.bfloat16, "row")
    sel = gemmtune.tune("mm", a, b, store=None, settings=gemmtune.Settings(store="off"))
    win = next(t for t in sel.timings if t.choice == sel.winner)
    assert win.host_ms is not None and win.gpu_ms is not None
    assert win.ms == max(win.gpu_ms, win.host_ms)
