"""The eager API on a CUDA GPU: bf16 correctness, torch.compile, patch() (skipped without CUDA)."""

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.dispatch import eager as api
from gemmtune.dispatch.eager import addmm, bmm, clear_dispatch_cache, dispatch_stats, mm
from gemmtune.core.errors import LayoutError
from gemmtune.dispatch.patching import patch, unpatch

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")]

DEV = "cuda"
BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _fresh_dispatch():
    clear_dispatch_cache()
    yield
    clear_dispatch_cache()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error against a float64 reference (the correctness gate's measure)."""
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _weight_t(N, K, dtype=BF16):
    """B as nn.Linear holds it: the transpose of a contiguous [N, K] weight."""
    return torch.randn(N, K, device=DEV, dtype=dtype).t()


@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_mm_bf16_default_backends(b_layout):
    a = torch.randn(384, 512, device=DEV, dtype=BF16)
    b = _weight_t(640, 512) if b_layout == "col" else torch.randn(512, 640, device=DEV, dtype=BF16)
    out = mm(a, b)
    assert out.shape == (384, 640) and out.dtype == BF16 and out.is_contiguous()
    assert rel_err(out, a.double() @ b.double()) < 2e-2
    out2 = mm(a, b)
    torch.testing.assert_close(out2, out)
    s = dispatch_stats()
    assert (s["hits"], s["tunes"]) == (1, 1)
    families = {t.choice.family for sel in api.selections().values() for t in sel.timings}
    assert {"extern", "triton"} <= families


@pytest.mark.parametrize("bias_shape,alpha,beta", [((640,), 1.0, 1.0), ((384, 640), 0.5, 2.0), ((384, 1), 1.0, 0.0)])
def test_addmm_bf16_default_backends(bias_shape, alpha, beta):
    bias = torch.randn(*bias_shape, device=DEV, dtype=BF16)
    a, b = torch.randn(384, 512, device=DEV, dtype=BF16), _weight_t(640, 512)
    out = addmm(bias, a, b, alpha=alpha, beta=beta)
    ref = torch.addmm(bias.double(), a.double(), b.double(), alpha=alpha, beta=beta)
    assert out.shape == (384, 640) and rel_err(out, ref) < 2e-2
    torch.testing.assert_close(addmm(bias, a, b, alpha=alpha, beta=beta), out)


def test_bmm_bf16_default_backends():
    a = torch.randn(6, 192, 256, device=DEV, dtype=BF16)
    b = torch.randn(6, 320, 256, device=DEV, dtype=BF16).transpose(1, 2)
    out = bmm(a, b)
    assert out.shape == (6, 192, 320)
    assert rel_err(out, torch.bmm(a.double(), b.double())) < 2e-2
    torch.testing.assert_close(bmm(a, b), out)


def test_col_layout_with_cublas_and_layout_error_with_triton():
    a, b = torch.randn(256, 128, device=DEV, dtype=BF16), torch.randn(128, 192, device=DEV, dtype=BF16)
    out = mm(a, b, backends=("extern",), out_layout="col")
    assert out.stride() == (1, 256) and rel_err(out, a.double() @ b.double()) < 2e-2
    with pytest.raises(LayoutError):
        mm(a, b, backends=("triton",), out_layout="col")


def test_triton_winner_backward_matches_torch():
    a = torch.randn(256, 128, device=DEV, requires_grad=True)
    b = torch.randn(128, 192, device=DEV, requires_grad=True)
    out = mm(a, b, backends=("triton",))
    g = torch.randn_like(out)
    out.backward(g)
    assert {s.winner.family for s in api.selections().values()} == {"triton"}
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    (a2 @ b2).backward(g)
    # fp32 through Triton follows torch's TF32 setting; compare with the tolerance of either
    assert rel_err(a.grad, a2.grad) < 5e-3 and rel_err(b.grad, b2.grad) < 5e-3


def _block(x, w1, b1, w2):
    h = torch.nn.functional.gelu(addmm(b1, x, w1.t()))
    return mm(h, w2.t())


def test_torch_compile_fullgraph_matches_eager_bf16():
    torch._dynamo.reset()
    try:
        x = torch.randn(256, 512, device=DEV, dtype=BF16)
        w1, b1 = torch.randn(1024, 512, device=DEV, dtype=BF16) / 20, torch.randn(1024, device=DEV, dtype=BF16)
        w2 = torch.randn(256, 1024, device=DEV, dtype=BF16) / 30
        want = _block(x, w1, b1, w2)
        tunes = dispatch_stats()["tunes"]
        got = torch.compile(_block, fullgraph=True)(x, w1, b1, w2)
        assert dispatch_stats()["tunes"] == tunes  # the compiled graph's ops reuse the eager winners
        assert rel_err(got, want) < 2e-2
    finally:
        torch._dynamo.reset()


def test_patch_mlp_bf16_matches_unpatched_outputs_and_grads():
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512, bias=False)).to(DEV, BF16)
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512, bias=False)).to(DEV, BF16)
    model.load_state_dict(ref.state_dict())
    x = torch.randn(4, 64, 512, device=DEV, dtype=BF16)
    want = ref(x)
    patch(model)
    got = model(x)
    assert got.shape == want.shape and rel_err(got, want) < 2e-2
    got.float().square().mean().backward()
    want.float().square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel_err(p.grad, q.grad) < 3e-2, name
    assert dispatch_stats()["tunes"] >= 2
    unpatch(model)
    torch.testing.assert_close(model(x), want)


def test_patch_under_torch_compile_gpu():
    torch._dynamo.reset()
    try:
        torch.manual_seed(4)
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 128)).to(DEV, BF16)
        x = torch.randn(128, 256, device=DEV, dtype=BF16)
        want = model(x)
        patch(model, backends=("extern",))
        got = torch.compile(model, fullgraph=True)(x)
        assert rel_err(got, want) < 2e-2
    finally:
        torch._dynamo.reset()


def test_package_exports():
    if not hasattr(gemmtune, "mm"):
        pytest.skip("gemmtune/__init__.py does not export the API yet")
    assert gemmtune.mm is mm


@pytest.mark.parametrize("mkn", [(1, 512, 256), (96, 256, 160)])
def test_addmm_alpha_zero_and_beta_zero_follow_torch_on_every_triton_kernel(mkn):
    """alpha = 0: A @ B is not computed (NaN/Inf in A do not propagate); beta = 0: the bias is ignored.
    The gate's reference follows these semantics (torch's on CPU), so a Triton candidate that let the
    NaN through fails it.  torch.addmm on CUDA is not the expectation here: cuBLAS multiplies by
    alpha = 0 and propagates the NaN (H200, torch 2.11: every element of the NaN rows)."""
    m, k, n = mkn
    a, b = torch.randn(m, k, device=DEV, dtype=BF16), torch.randn(k, n, device=DEV, dtype=BF16)
    bias = torch.randn(n, device=DEV, dtype=BF16)
    a[0, 1], a[-1, 0] = float("nan"), float("inf")
    sel = gemmtune.tune("addmm", bias, a, b, alpha=0.0, backends=("triton",), settings=gemmtune.Settings(store="off"))
    ok = [t.choice for t in sel.timings if t.status == "ok"]
    assert ok, "no Triton candidate passed the gate"
    got0 = sel(bias, a, b)
    assert not torch.isnan(got0).any() and not torch.isinf(got0).any()
    torch.testing.assert_close(got0, bias.expand(m, n), rtol=1e-2, atol=1e-2)  # beta * bias, beta = 1
    nan_bias = torch.full((n,), float("nan"), device=DEV, dtype=BF16)
    a2 = torch.randn(m, k, device=DEV, dtype=BF16)
    got = addmm(nan_bias, a2, b, beta=0.0, backends=("triton",))
    assert not torch.isnan(got).any()
    assert rel_err(got, a2.double() @ b.double()) < 2e-2
