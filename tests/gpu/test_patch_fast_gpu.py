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


@pytest.mark.parametrize("bias", [False, True])
def test_a_patched_head_of_an_odd_vocabulary_returns_padded_rows_on_every_call(bias):
    # patch(out_layout="padded"): the head's pick writes rows of a 128-byte stride (30523 -> 30528), every call.
    torch.manual_seed(0)
    head = nn.Linear(768, 30523, bias=bias, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 300, 768, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = head(x)
        gemmtune.patch(head, out_layout="padded")
        for _ in range(3):  # the tune, then the fast path
            out = head(x)
            assert out.shape == ref.shape and out.stride() == (300 * 30528, 30528, 1)
            _close(out, ref)
    gemmtune.unpatch(head)
