"""Triton template correctness through Triton's interpreter (CPU, small odd shapes)."""

import os

import pytest
import torch

pytest.importorskip("triton")
if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests run on machines without CUDA (tests/gpu covers CUDA)", allow_module_level=True)

import gemmtune  # noqa: E402
from gemmtune.measure.correctness import check, reference  # noqa: E402
from gemmtune.core.inputs import KernelInputs  # noqa: E402
from gemmtune.templates.extern import AtenTemplate  # noqa: E402
from gemmtune.templates.triton.base import SWIZZLES  # noqa: E402
from gemmtune.templates.triton.mm import TritonMMTemplate  # noqa: E402

SMALL = [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2, num_warps=4),
         dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=32, num_stages=2, num_warps=4)]


def operands(op, M, K, N, dtype, b_layout, batch=1):
    lead = (batch,) if op == "bmm" else ()
    a = torch.randn(*lead, M, K, dtype=dtype)
    b = torch.randn(*lead, N, K, dtype=dtype).transpose(-1, -2) if b_layout == "col" else torch.randn(*lead, K, N, dtype=dtype)
    if op == "addmm":
        return (torch.randn(N, dtype=dtype), a, b)
    return (a, b)


def run_all(op, tensors, alpha=1.0, beta=1.0):
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    template = TritonMMTemplate(space=SMALL)
    choices = template.configs(ki)
    assert {c.runtime_dict["swizzle"] for c in choices} == set(SWIZZLES)
    ref = reference(ki, tensors)
    launchers = {}
    for c in choices:
        launch = launchers.setdefault(c.binary_key, template.compile(c, ki, tensors))
        out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype)  # poison: every element must be written
        launch(tensors, out, **c.runtime_dict)
        assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))
    return ki, choices


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(37, 45, 29), (1, 70, 33), (50, 17, 1)])
def test_mm_odd_shapes(dtype, b_layout, shape):
    M, K, N = shape
    run_all("mm", operands("mm", M, K, N, dtype, b_layout))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_addmm_alpha_beta_bias(dtype):
    run_all("addmm", operands("addmm", 33, 40, 21, dtype, "col"), alpha=0.5, beta=-2.0)


def test_addmm_beta_zero_ignores_nan_bias():
    bias, a, b = operands("addmm", 20, 24, 18, torch.float32, "row")
    bias = torch.full_like(bias, float("nan"))
    run_all("addmm", (bias, a, b), beta=0.0)


def test_addmm_2d_bias():
    _, a, b = operands("addmm", 19, 24, 18, torch.float32, "row")
    run_all("addmm", (torch.randn(19, 18), a, b), alpha=2.0, beta=0.5)


@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_bmm(b_layout):
    run_all("bmm", operands("bmm", 17, 33, 20, torch.float16, b_layout, batch=3))


def test_transposed_a():
    a = torch.randn(40, 23).t()  # [23, 40] with strides (1, 23)
    b = torch.randn(40, 31)
    run_all("mm", (a, b))


def test_operands_seen_through_aligned_storage_with_an_odd_edge_read_nothing_past_their_storage():
    # B's rows and A's columns are 32 elements apart (aligned) but N = 21 and M = 19 are odd; the storage
    # ends right after the last row's last element, so a wrap rounded up past N or M would read beyond it.
    b = torch.empty_strided((24, 21), (32, 1))
    b.copy_(torch.randn(24, 21))
    a = torch.empty_strided((24, 19), (32, 1))
    a.copy_(torch.randn(24, 19))
    ki, _ = run_all("mm", (a.t(), b))  # A [19, 24] column-major, B [24, 21] row-major
    from gemmtune.templates.triton.mm import index_hints

    assert index_hints(ki, 32, 16, 16) == {"N_WRAP": 21, "HINT_M": 1, "HINT_N": 1, "CLAMP_M": False}
    assert index_hints(ki, 32, 16, 16, whole_rows=True) == {"N_WRAP": 32, "HINT_M": 1, "HINT_N": 16, "CLAMP_M": False}


def test_a_launcher_refuses_a_column_major_a_whose_m_would_split_its_vectors():
    from gemmtune.templates.triton.mm import checked_strides

    meta = dict(HINT_M=16, DIV_AM=1, DIV_AK=16, DIV_BK=1, DIV_BN=1, DIV_CM=8)
    args = (None,) * 4 + (64, 8, 8, 0, 1, 64, 0, 8, 1, 0, 8, 1)
    assert checked_strides(meta, args) is args
    with pytest.raises(RuntimeError, match="M = 40 is not a multiple of the 16 rows"):
        checked_strides(meta, (None,) * 4 + (40,) + args[5:])


def test_one_binary_serves_every_swizzle():
    ki, choices = run_all("mm", operands("mm", 40, 32, 24, torch.float32, "row"))
    assert len({c.binary_key for c in choices}) == len(choices) // len(SWIZZLES)


def test_tune_end_to_end_through_the_interpreter():
    a, b = operands("mm", 40, 24, 36, torch.float32, "col")
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), TritonMMTemplate(space=SMALL)],
                        backends=("extern", "triton"), strategy="exhaustive")
    assert sel.layout.kind == "fixed"
    templated = [t for t in sel.timings if not t.choice.is_extern]
    assert templated and all(t.status == "ok" and t.ms is not None for t in templated)
    torch.testing.assert_close(sel(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_fp64_is_not_offered_to_the_triton_template():
    t = TritonMMTemplate(space=SMALL)
    assert not t.supports(KernelInputs.from_tensors("mm", torch.ones(4, 4, dtype=torch.float64), torch.ones(4, 4, dtype=torch.float64)))


@pytest.mark.parametrize("beta", [0.5, 0.0])
def test_addmm_alpha_zero_drops_nan_and_inf_of_the_operands(beta):
    bias, a, b = operands("addmm", 20, 24, 18, torch.float32, "row")
    a[3, 4], b[5, 6] = float("nan"), float("inf")  # torch.addmm(alpha=0) does not compute A @ B
    ki, choices = run_all("addmm", (bias, a, b), alpha=0.0, beta=beta)
    out = TritonMMTemplate(space=SMALL).compile(choices[0], ki, (bias, a, b))((bias, a, b), **choices[0].runtime_dict)
    torch.testing.assert_close(out, torch.addmm(bias, a, b, alpha=0.0, beta=beta))
