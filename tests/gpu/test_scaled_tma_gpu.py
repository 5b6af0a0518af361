"""GPU tests of the persistent TMA fp8 template (`triton_scaled_tma`, a preview template); skipped without
CUDA or below compute capability 9 (TMA).

Run on an H200:  python -m pytest -q tests/gpu/test_scaled_tma_gpu.py
"""

import pytest
import torch

import gemmtune
from gemmtune.core.inputs import KernelInputs
from gemmtune.measure.correctness import check, reference
from gemmtune.templates.extern import AtenScaledMMTemplate
from gemmtune.templates.triton.scaled_tma import TritonScaledTMATemplate
from helpers import fp8_operands

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
pytestmark = pytest.mark.skipif(not HOPPER, reason="needs CUDA with TMA (capability >= 9.0)")
BF16 = torch.bfloat16
SPACE = [dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, num_stages=4, num_warps=4),
         dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_stages=3, num_warps=8),
         dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=8),
         dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=256, num_stages=3, num_warps=4)]


def quantised(M, K, N, rowwise):
    return fp8_operands(M, K, N, rowwise, device="cuda")  # quantised as torchao does (tests/helpers.py)


@pytest.mark.parametrize("out_dtype", [BF16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast_accum"])
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("shape", [(1000, 1024, 512), (16, 4096, 1024), (1, 512, 272)])
def test_every_config_and_swizzle_passes_the_gate(shape, rowwise, fast, out_dtype):
    if out_dtype is torch.float32 and rowwise:
        pytest.skip("row-wise scales with a float32 output: torch's rule on this GPU decides (test_fp8_fuzz_gpu)")
    bias = (torch.randn(shape[2], device="cuda").to(out_dtype),) if out_dtype is BF16 else ()
    tensors = quantised(*shape, rowwise) + bias
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=out_dtype, fast_accum=fast)
    template = TritonScaledTMATemplate(space=SPACE)
    assert template.supports(ki)
    ref, launchers = reference(ki, tensors), {}
    for c in template.configs(ki):
        launch = launchers.setdefault(c.binary_key, template.compile(c, ki, tensors))
        out = torch.full(ki.out_size, float("nan"), dtype=out_dtype, device="cuda")
        launch(tensors, out, **c.runtime_dict)
        torch.cuda.synchronize()
        assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))


def test_a_tune_with_previews_times_it_beside_cublaslt(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path))
    tensors = quantised(512, 1024, 768, True)
    sel = gemmtune.tune("scaled_mm", *tensors, templates=[AtenScaledMMTemplate(), TritonScaledTMATemplate(space=SPACE)],
                        strategy="exhaustive")
    timed = {t.choice.template_uid for t in sel.timings if t.status == "ok" and t.ms is not None}
    assert timed == {"aten_scaled_mm", "triton_scaled_tma"}
    torch.testing.assert_close(sel.kernel(*tensors), torch._scaled_mm(*tensors, out_dtype=BF16), rtol=2e-2, atol=2e-2)
