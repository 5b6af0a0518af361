"""Autocast on CUDA (run on an H200): Triton and cuBLAS winners return torch's dtype; the tuned problem is the cast one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune


pytestmark = pytest.mark.usefixtures("memory_store")


def _operands(op):
    dev = "cuda"
    if op == "bmm":
        return (torch.randn(2, 256, 128, device=dev), torch.randn(2, 128, 192, device=dev))
    if op == "addmm":
        return (torch.randn(192, device=dev), torch.randn(256, 128, device=dev), torch.randn(128, 192, device=dev))
    return (torch.randn(256, 128, device=dev), torch.randn(128, 192, device=dev))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("family", ["triton", "extern"])
@pytest.mark.parametrize("op", ["mm", "addmm", "bmm"])
def test_cuda_autocast_result_dtype_and_tuned_problem(op, family, dtype):
    args = _operands(op)
    with torch.autocast("cuda", dtype=dtype):
        ref = getattr(torch, op)(*args)
        got = getattr(gemmtune, op)(*args, backends=(family,))
    assert got.dtype == ref.dtype == dtype
    name = str(dtype).split(".")[-1]
    assert all(name in problem for problem in gemmtune.dispatch_stats()["selections"])
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm"])
def test_cuda_autocast_under_torch_compile_with_triton(op):
    args = _operands(op)
    fn = getattr(gemmtune, op)
    compiled = torch.compile(lambda *t: fn(*t, backends=("triton",)), fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = compiled(*args)
        ref = getattr(torch, op)(*args)
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=5e-2)


def test_cuda_autocast_patched_linear():
    lin = nn.Linear(128, 192).cuda()
    x = torch.randn(4, 64, 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = lin(x)
        gemmtune.patch(lin, backends=("triton",))
        try:
            got = lin(x)
        finally:
            gemmtune.unpatch(lin)
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=5e-2)
