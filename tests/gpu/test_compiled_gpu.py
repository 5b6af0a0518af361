"""gemmtune inside torch.compile on a GPU: the pick is emitted into Inductor's generated code (aten
op or the Triton kernel itself, launched with no Python between calls), with fullgraph=True,
mode="reduce-overhead" (CUDA graphs), autograd and several GEMMs per graph."""

from __future__ import annotations

import pytest
import torch

import gemmtune
from torch._inductor.utils import run_and_get_code


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("GEMMTUNE_STORE", "memory")
    gemmtune.clear_dispatch_cache()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _close(out, ref):
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err < 2e-2, f"relative error {err:.3e}"


@pytest.mark.parametrize("m", [1, 16, 256])
def test_triton_pick_is_the_kernel_in_generated_code(m):
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda x, w: torch.relu(gemmtune.mm(x, w.t(), backends=("triton",))), fullgraph=True)
    out, code = run_and_get_code(f, x, w)
    _close(out, torch.relu(x @ w.t()))
    text = "\n".join(code)
    assert "torch.ops.gemmtune" not in text  # no opaque op: the kernel is launched by the generated code
    assert "gemm_kernel" in text or "gemv_kernel" in text
    _close(f(x, w), torch.relu(x @ w.t()))


def test_default_backends_several_gemms_fullgraph_and_autograd():
    lin1 = torch.nn.Linear(512, 1024, device="cuda", dtype=torch.bfloat16)
    lin2 = torch.nn.Linear(1024, 256, bias=False, device="cuda", dtype=torch.bfloat16)
    model = gemmtune.patch(torch.nn.Sequential(lin1, torch.nn.GELU(), lin2))
    ref_model = torch.nn.Sequential(lin1, torch.nn.GELU(), lin2)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    f = torch.compile(model, fullgraph=True)
    out, code = run_and_get_code(f, x)
    gemmtune.unpatch(model)
    ref = ref_model(x)
    _close(out, ref)
    assert "torch.ops.gemmtune" not in "\n".join(code)
    out.float().sum().backward()
    g = x.grad.clone()
    x.grad = None
    ref.float().sum().backward()
    _close(g, x.grad)


def test_reduce_overhead_cuda_graphs():
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda x, w: gemmtune.mm(x, w.t()) * 2, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):
        out = f(x, w)
    _close(out, (x @ w.t()) * 2)
