"""Autocast on CUDA (run on an H200): Triton and cuBLAS winners return torch's dtype; the tuned problem is the cast one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune
from helpers import compiled_op_under_autocast, patched_linear_under_autocast


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
    got, ref = compiled_op_under_autocast(op, _operands(op), "cuda", ("triton",))
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=5e-2)


def test_cuda_autocast_patched_linear():
    lin = nn.Linear(128, 192).cuda()
    got, ref = patched_linear_under_autocast(lin, torch.randn(4, 64, 128, device="cuda"), "cuda", ("triton",))
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=5e-2)
