"""GPU tests of the preview template `triton_gemv` (M <= 4); skipped without CUDA.

Run on an H200 before moving it into the default pool:
    python -m pytest -v tests/gpu/test_preview_templates.py -s
"""

import pytest
import torch

import gemmtune
from gemmtune.measure.correctness import check, reference
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.triton.gemv import TritonGemvTemplate
from gpu_operands import operands

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def check_every_config(op, tensors, alpha=1.0, beta=1.0):
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    t = TritonGemvTemplate()
    ref = reference(ki, tensors)
    for c in t.configs(ki):
        out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype, device="cuda")
        t.compile(c, ki, tensors)(tensors, out)
        torch.cuda.synchronize()
        assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(1, 4096, 6144), (4, 14336, 4096), (3, 1000, 999)])
def test_gemv_correct(dtype, b_layout, shape):
    check_every_config("mm", operands("mm", *shape, dtype, b_layout))


def test_gemv_addmm_and_bmm():
    check_every_config("addmm", operands("addmm", 2, 4096, 1000, torch.bfloat16, "col"), alpha=0.5, beta=2.0)
    check_every_config("bmm", operands("bmm", 1, 2048, 3000, torch.bfloat16, "col", batch=4))


@pytest.mark.parametrize("shape", [(1, 4096, 6144), (1, 14336, 4096), (1, 4096, 28672)])
def test_default_tune_with_previews_offers_gemv(shape):
    M, K, N = shape
    a, b = operands("mm", M, K, N, torch.bfloat16, "col")
    sel = gemmtune.tune("mm", a, b, settings=gemmtune.Settings(store="off", preview_templates=True))
    gemv = [t for t in sel.timings if t.choice.template_uid == "triton_gemv"]
    assert gemv and all(t.status in ("ok", "not_benchmarked") for t in gemv)
    best = min((t for t in gemv if t.gpu_ms), key=lambda t: t.gpu_ms)
    lib = min((t for t in sel.timings if t.choice.is_extern and t.gpu_ms), key=lambda t: t.gpu_ms)
    print(f"\n{shape}: winner {sel.winner.key} {sel.winner_ms:.4f} ms; best GEMV {best.choice.key} GPU "
          f"{best.gpu_ms:.4f} ms host {best.host_ms:.4f} ms; library GPU {lib.gpu_ms:.4f} ms host {lib.host_ms:.4f} ms")
    torch.testing.assert_close(sel(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=0.5)
