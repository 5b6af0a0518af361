"""The launch bound to one problem on the GPU: every single-kernel Triton template's bound launcher
gives the reference result without the general launch (no argument building, no JIT), declines a
misaligned operand (the general path takes it, still right), and a warm `gemmtune.mm` / `addmm` to a
Triton winner runs bound."""

from __future__ import annotations

import time

import pytest
import torch

import gemmtune
from gemmtune.dispatch import eager as api
from gemmtune.measure.correctness import check, reference
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.triton.base import KernelLaunch
from gemmtune.templates.triton.gemv import TritonGemvTemplate
from gemmtune.templates.triton.mm import TritonMMTemplate
from gemmtune.templates.triton.skinny import TritonSkinnyTemplate
from gemmtune.templates.triton.tma import TritonTMAPersistentTemplate

pytestmark = pytest.mark.usefixtures("memory_store")


def _operands(op, m, k=1024, n=768):
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    return (a, w.t()) if op == "mm" else (bias, a, w.t())


def _host_us(fn, n=2000):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


@pytest.mark.parametrize("template,m", [(TritonMMTemplate, 64), (TritonSkinnyTemplate, 16), (TritonGemvTemplate, 1),
                                        (TritonTMAPersistentTemplate, 256)])
@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_template_bound_launcher(template, m, op, monkeypatch):
    tensors = _operands(op, m)
    ki = KernelInputs.from_tensors(op, *tensors, alpha=1.0, beta=1.0)
    t = template()
    if not t.supports(ki) or not t.configs(ki):
        pytest.skip(f"{t.uid} does not serve {ki.describe()}")
    if t.uid == "triton_tma_persistent":  # TMA wants B as stored: contiguous rows of K
        tensors = (*tensors[:-1], tensors[-1].t().contiguous().t())
    c = t.configs(ki)[-1]
    launch = t.compile(c, ki, tensors)
    bound = launch.bound(tensors, **c.runtime_dict)
    assert bound is not None
    ref = reference(ki, tensors)
    general = []
    monkeypatch.setattr(KernelLaunch, "__call__", lambda self, args: general.append(args))
    assert check(ki, bound(*tensors), ref) is None
    assert general == []
    monkeypatch.undo()
    if t.uid != "triton_tma_persistent":  # TMA refuses misaligned operands outright
        a = tensors[-2]
        odd = torch.empty(a.numel() + 1, device="cuda", dtype=a.dtype)[1:].view_as(a)
        odd.copy_(a)
        assert check(ki, bound(*tensors[:-2], odd, tensors[-1]), ref) is None
    print(f"\n{t.uid} {op}: host us per call: bound {_host_us(lambda: bound(*tensors)):.1f}, "
          f"general {_host_us(lambda: launch(tensors, **c.runtime_dict)):.1f}")


@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_warm_dispatch_to_triton_runs_bound(op, monkeypatch):
    tensors = _operands(op, 16)
    fn = gemmtune.mm if op == "mm" else gemmtune.addmm
    ref = torch.mm(*tensors) if op == "mm" else torch.addmm(*tensors)
    fn(*tensors, backends=("triton",))  # tunes
    (sel,) = api.selections().values()
    if sel.winner.template_uid == "triton_splitk":
        pytest.skip("split-K launches two kernels: no binding")
    fn(*tensors, backends=("triton",))  # the first warm call binds
    general = []
    monkeypatch.setattr(KernelLaunch, "__call__", lambda self, args: general.append(args))
    fresh = tuple(t.clone() for t in tensors)
    out = fn(*fresh, backends=("triton",))
    assert general == [], f"{sel.winner.name}: the warm call took the general launch"
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err < 2e-2
