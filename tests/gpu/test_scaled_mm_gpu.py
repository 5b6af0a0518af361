"""GPU tests of the `triton_scaled_mm` template (fp8 `torch._scaled_mm`); skipped without CUDA or without
fp8 tensor cores (compute capability < 8.9).

Run on an H200:  python -m pytest -q tests/gpu/test_scaled_mm_gpu.py
"""

import pytest
import torch

import gemmtune
from gemmtune.core.inputs import KernelInputs
from gemmtune.measure.correctness import check, reference
from gemmtune.templates.extern import AtenScaledMMTemplate
from gemmtune.templates.registry import active_templates
from gemmtune.templates.triton.scaled_mm import TritonScaledMMTemplate

FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
pytestmark = pytest.mark.skipif(not FP8, reason="needs CUDA with fp8 tensor cores (capability >= 8.9)")
E4M3, BF16 = torch.float8_e4m3fn, torch.bfloat16
SPACE = [dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, num_stages=4, num_warps=4),
         dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_stages=3, num_warps=8),
         dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, num_stages=4, num_warps=4)]


def quantised(M, K, N, rowwise):
    """(a, b, scale_a, scale_b) on the GPU, quantised as torchao does (`offline.fp8_spec.quantise`:
    scale = amax / 448), B = w.t() column-major."""
    from gemmtune.offline.fp8_spec import quantise

    a, sa = quantise(torch.randn(M, K, device="cuda"), E4M3, rowwise)
    w, sw = quantise(torch.randn(N, K, device="cuda"), E4M3, rowwise)
    return a, w.t(), sa, (sw.t().contiguous() if rowwise else sw)


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast_accum"])
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("shape", [(1000, 1024, 512), (16, 4096, 1024)])
def test_every_config_and_swizzle_passes_the_gate(shape, rowwise, fast):
    tensors = quantised(*shape, rowwise) + (torch.randn(shape[2], device="cuda").to(BF16),)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16, fast_accum=fast)
    template = TritonScaledMMTemplate(space=SPACE)
    ref, launchers = reference(ki, tensors), {}
    for c in template.configs(ki):
        launch = launchers.setdefault(c.binary_key, template.compile(c, ki, tensors))
        out = torch.full(ki.out_size, float("nan"), dtype=BF16, device="cuda")
        launch(tensors, out, **c.runtime_dict)
        torch.cuda.synchronize()
        assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))


def test_the_default_pool_has_it_and_a_tune_times_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path))
    tensors = quantised(512, 1024, 768, True)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors)
    assert [t.uid for t in active_templates(ki, None)][:2] == ["aten_scaled_mm", "triton_scaled_mm"]
    sel = gemmtune.tune("scaled_mm", *tensors, templates=[AtenScaledMMTemplate(), TritonScaledMMTemplate(space=SPACE)],
                        strategy="exhaustive")
    timed = {t.choice.template_uid for t in sel.timings if t.status == "ok" and t.ms is not None}
    assert timed == {"aten_scaled_mm", "triton_scaled_mm"}
    want = torch._scaled_mm(*tensors, out_dtype=BF16)
    torch.testing.assert_close(sel(*tensors), want, rtol=2e-2, atol=2e-2)
    out = gemmtune.scaled_mm(*tensors)  # the default pool, as a user calls it
    assert check(ki, out, reference(ki, tensors)) is None
