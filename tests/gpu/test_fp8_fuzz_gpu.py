"""bench/fuzz.py --kind fp8 on a GPU: 30 seeded fp8 problems (odd M, both scale kinds, with and without a
bias, e4m3 and e5m2, both `use_fast_accum` settings, and calls torch refuses) through every kernel of the
pool (a fixed sample of triton_scaled_mm's default space x every swizzle, and cuBLASLt), gemmtune.scaled_mm
and torch._scaled_mm; torch's verdict is torch's own call on the GPU.  Skipped without CUDA or without fp8
tensor cores (compute capability < 8.9).

Run on an H200:  python -m pytest -q -s tests/gpu/test_fp8_fuzz_gpu.py
"""

import pytest
import torch

import gemmtune

from helpers import load_bench

FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
pytestmark = pytest.mark.skipif(not FP8, reason="needs CUDA with fp8 tensor cores (capability >= 8.9)")
fz = load_bench("fuzz")


def test_thirty_seeded_cases_give_no_wrong_result_and_refusals_agree_with_torch(monkeypatch):
    monkeypatch.setenv("GEMMTUNE_STORE", "memory")  # every case tuned afresh
    monkeypatch.setenv("GEMMTUNE_EFFORT", "quick")
    gemmtune.clear_dispatch_cache()
    space = fz.fuzz_space("cuda", "default", 4, seed=0)
    tally = fz.fuzz(30, seed=0, max_dim=512, device="cuda", space=space)
    print(fz.table(tally))
    c = tally.counts
    assert c["cases"] == 30 and c["computed"] >= 12 and c["kernels run"] > 4 * c["computed"], dict(c)
    assert (c["wrong"], c["error"]) == (0, 0), tally.findings
    assert c["mismatch"] == 0, tally.findings  # gemmtune refuses exactly what torch refuses on this GPU
    assert tally.per_kernel["triton_scaled_mm", "ok"] >= 4 * len(space)
