"""A patched nn.Linear on the GPU: once decided, a cuBLAS winner runs F.linear and a Triton winner its
kernel, with outputs and gradients matching the unpatched layer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.dispatch import patching


pytestmark = pytest.mark.usefixtures("memory_store")


def _close(out, ref):
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err < 2e-2, f"relative error {err:.3e}"


@pytest.mark.parametrize("backends", [("extern",), ("triton",)])
@pytest.mark.parametrize("bias", [False, True])
def test_patched_linear_fast_path_on_gpu(backends, bias):
    torch.manual_seed(0)
    plain = nn.Linear(512, 768, bias=bias, device="cuda", dtype=torch.bfloat16)
    patched = nn.Linear(512, 768, bias=bias, device="cuda", dtype=torch.bfloat16)
    patched.load_state_dict(plain.state_dict())
    gemmtune.patch(patched, backends=backends)
    x = torch.randn(2, 24, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        first = patched(x)
        (fn,) = patching._LINEAR.values()
        assert (fn is torch.nn.functional.linear) == (backends == ("extern",))
        _close(patched(x), plain(x))
        _close(first, plain(x))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    patched(x1).float().square().sum().backward()
    plain(x2).float().square().sum().backward()
    _close(x1.grad, x2.grad)
    _close(patched.weight.grad, plain.weight.grad)
