"""Padded candidates (gemmtune.templates.padded): which dimensions pad, the padded launcher's result for
every op and layout, a parameter padded once and again after it changes, the pool on a GPU problem,
and a tune on CPU where a padded twin competes (real kernels: torch's ops, Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

import gemmtune
from gemmtune.core.choices import Choice
from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.store.catalog import catalog_fault
from gemmtune.store.keys import Row
from gemmtune.templates.extern import AtenScaledMMTemplate, AtenTemplate
from gemmtune.templates.padded import PaddedTemplate, padded_problem, padding_dims
from gemmtune.templates.registry import active_templates
from gemmtune.templates.triton.mm import TritonMMTemplate

from helpers import fp8_operands

BF16 = torch.bfloat16


def _launch(template, op, *tensors, **kw):
    ki = KernelInputs.from_tensors(op, *tensors, **kw)
    t = PaddedTemplate(template)
    choice = t.configs(ki)[0]
    return t.compile(choice, ki, tensors), choice.runtime_dict


def _problem(m, k, n, b_col=True, device="cpu", dtype=BF16):
    metas = (TensorMeta((m, k), (k, 1), dtype, device), TensorMeta((k, n), (1, k) if b_col else (n, 1), dtype, device))
    return KernelInputs("mm", metas)


@pytest.mark.parametrize("m,k,n,b_col,want", [
    (777, 1234, 5555, False, {"N": 5568, "K": 1280}),  # 128-byte rows: at most 1/16 more
    (777, 1234, 5555, True, {"N": 5568, "K": 1280}),
    (16, 4096, 32001, True, {"N": 32064}),
    (401408, 20, 72, True, {"K": 24}),  # 16-byte rows: 128-byte ones would add more than 1/16
    (4097, 4096, 6144, True, {}),  # M is no operand's leading dimension here
])
def test_the_padded_dimensions_are_the_misaligned_leading_ones(m, k, n, b_col, want):
    assert padding_dims(_problem(m, k, n, b_col)) == want


def test_the_alignment_follows_the_dtype_and_a_column_major_a_pads_m():
    a = torch.empty_strided((13, 12), (1, 13), dtype=torch.float32)  # column-major A: M leads
    b = torch.empty(12, 6, dtype=torch.float32)
    assert padding_dims(KernelInputs.from_tensors("mm", a, b)) == {"M": 16, "N": 8}
    assert padding_dims(_problem(8, 12, 6, dtype=torch.float16)) == {"N": 8, "K": 16}
    big = padded_problem(KernelInputs.from_tensors("mm", a, b))
    assert (big.M, big.K, big.N) == (16, 12, 8) and big.a.stride == (1, 16)


@pytest.mark.parametrize("b_col", [False, True], ids=["b_row", "b_col"])
@pytest.mark.parametrize("with_out", [False, True], ids=["new_out", "into_out"])
def test_a_padded_mm_computes_torch_mm(b_col, with_out):
    a = torch.randn(13, 21)
    b = torch.randn(19, 21).t() if b_col else torch.randn(21, 19)
    launch, rt = _launch(AtenTemplate("mm"), "mm", a, b)
    out = torch.full((13, 19), float("nan")) if with_out else None
    got = launch((a, b), out, **rt)
    assert got.shape == (13, 19) and got.is_contiguous()
    torch.testing.assert_close(got, a @ b)
    if with_out:
        assert got.data_ptr() == out.data_ptr()


@pytest.mark.parametrize("bias_shape", [(19,), (1, 19), (13, 19), (13, 1)])
def test_a_padded_addmm_pads_its_bias_with_the_output(bias_shape):
    bias, a, b = torch.randn(bias_shape), torch.randn(13, 21), torch.randn(21, 19)
    launch, rt = _launch(AtenTemplate("addmm"), "addmm", bias, a, b, alpha=0.5, beta=2.0)
    torch.testing.assert_close(launch((bias, a, b), None, **rt), torch.addmm(bias, a, b, alpha=0.5, beta=2.0))


def test_a_padded_bmm_computes_torch_bmm():
    a, b = torch.randn(3, 9, 7), torch.randn(3, 7, 5)
    launch, rt = _launch(AtenTemplate("bmm"), "bmm", a, b)
    torch.testing.assert_close(launch((a, b), None, **rt), torch.bmm(a, b))


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_a_padded_scaled_mm_computes_torch_scaled_mm(rowwise):
    a, b, sa, sb = fp8_operands(24, 40, 36, rowwise, torch.float8_e4m3fn)
    bias = torch.randn(36, dtype=BF16)
    # from_tensors refuses K and N off multiples of 16 (cuBLASLt's rule), so the problem is built here
    ki = KernelInputs("scaled_mm", tuple(TensorMeta.of(t) for t in (a, b, sa, sb, bias)), out_dtype=BF16)
    assert padding_dims(ki) == {"N": 48, "K": 48}
    t = PaddedTemplate(AtenScaledMMTemplate())
    launch, rt = t.compile(t.configs(ki)[0], ki, (a, b, sa, sb, bias)), {}
    want = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=BF16)
    torch.testing.assert_close(launch((a, b, sa, sb, bias), None, **rt), want)


def test_a_padded_triton_kernel_computes_the_product():
    a, b = torch.randn(20, 13), torch.randn(13, 11)
    tile = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2, num_warps=4)
    launch, rt = _launch(TritonMMTemplate(space=[tile]), "mm", a, b)
    torch.testing.assert_close(launch((a, b), None, **rt), a @ b, rtol=1e-4, atol=1e-4)


def test_a_triton_twin_keeps_n_and_writes_the_output_itself():
    tile = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2, num_warps=4)
    a, b = torch.randn(20, 13), torch.randn(13, 11)  # float32: K 13 -> 16; N 11 stays, B's rows padded to 12
    ki = KernelInputs.from_tensors("mm", a, b)
    inner = padded_problem(ki, keep_n=True)
    assert (inner.M, inner.K, inner.N) == (20, 16, 11) and inner.b.stride == (12, 1)
    launch, rt = _launch(TritonMMTemplate(space=[tile]), "mm", a, b)
    out = torch.full((20, 11), float("nan"))
    got = launch((a, b), out, **rt)
    assert got.data_ptr() == out.data_ptr()  # no block copied out
    torch.testing.assert_close(got, a @ b, rtol=1e-4, atol=1e-4)
    bias = torch.randn(11)
    launch, rt = _launch(TritonMMTemplate(space=[tile]), "addmm", bias, a, b, alpha=0.5, beta=2.0)
    torch.testing.assert_close(launch((bias, a, b), None, **rt), torch.addmm(bias, a, b, alpha=0.5, beta=2.0),
                               rtol=1e-4, atol=1e-4)


def test_a_triton_twin_is_not_offered_where_only_the_outputs_n_is_misaligned():
    twin = PaddedTemplate(TritonMMTemplate())
    col = _problem(256, 768, 50257, b_col=True, device="cuda")  # B = weight.t(): N leads only the output
    assert padding_dims(col) == {"N": 50304} and not twin.supports(col)
    assert PaddedTemplate(AtenTemplate("mm")).keep_n is False and twin.keep_n is True
    assert twin.inner.whole_rows and not TritonMMTemplate().whole_rows  # the twin's kernels load whole rows


def test_a_parameter_is_padded_once_and_again_after_it_changes(monkeypatch):
    from gemmtune.templates import padded

    calls, copies = [], []
    real, real_copy = torch.constant_pad_nd, padded.padded_copy
    monkeypatch.setattr(torch, "constant_pad_nd", lambda t, widths: calls.append(tuple(t.shape)) or real(t, widths))
    monkeypatch.setattr(padded, "padded_copy", lambda t, *a: copies.append(tuple(t.shape)) or real_copy(t, *a))
    linear = torch.nn.Linear(21, 19, bias=False)
    x = torch.randn(13, 21)
    launch, rt = _launch(AtenTemplate("mm"), "mm", x, linear.weight.t())
    calls.clear()
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(launch((x, linear.weight.t()), None, **rt), x @ linear.weight.t())
        # the weight copied once; the activation is copied into kept storage (tests/test_staging.py)
        assert copies == [(21, 19)] and calls == []
        linear.weight.mul_(-2.0)  # an optimizer step: the parameter's version moves
        torch.testing.assert_close(launch((x, linear.weight.t()), None, **rt), x @ linear.weight.t())
        assert copies == [(21, 19)] * 2
    plain = torch.randn(19, 21).t()  # not a parameter: copied into kept storage on every call
    for _ in range(2):
        torch.testing.assert_close(launch((x, plain), None, **rt), x @ plain)
    assert copies == [(21, 19)] * 2 and calls == []


def test_a_frozen_weight_keeps_its_padded_copy_while_autograd_records_the_activations_gradient(monkeypatch):
    from gemmtune.templates import padded

    copies, real_copy = [], padded.padded_copy
    monkeypatch.setattr(padded, "padded_copy", lambda t, *a: copies.append(tuple(t.shape)) or real_copy(t, *a))
    linear = torch.nn.Linear(21, 19, bias=False).requires_grad_(False)  # a frozen base weight (LoRA)
    launch, rt = _launch(AtenTemplate("mm"), "mm", torch.randn(13, 21), linear.weight.t())
    for _ in range(2):
        x = torch.randn(13, 21, requires_grad=True)
        launch((x, linear.weight.t()), None, **rt).sum().backward()
        torch.testing.assert_close(x.grad, torch.ones(13, 19) @ linear.weight)
    assert copies == [(21, 19)]  # copied once, kept: autograd saves it, and nothing writes over it
    linear.weight.requires_grad_(True)  # a trained weight: its padded copy must carry the call's graph
    x = torch.randn(13, 21)
    launch((x, linear.weight.t()), None, **rt).sum().backward()
    torch.testing.assert_close(linear.weight.grad, (x.t() @ torch.ones(13, 19)).t())
    assert copies == [(21, 19)]


def _gpu_problem(m, k, n):
    return _problem(m, k, n, device="cuda:0")


def test_a_misaligned_gpu_problem_pools_each_templates_padded_twin():
    uids = [t.uid for t in active_templates(_gpu_problem(777, 1234, 5555), None, hopper=False)]
    assert "aten_mm" in uids and "padded_aten_mm" in uids and "padded_triton_mm" in uids
    assert not any(u.startswith("padded_") for u in [t.uid for t in active_templates(_gpu_problem(64, 64, 64), None, hopper=False)])
    named = [t.uid for t in active_templates(_gpu_problem(777, 1234, 5555), ("extern",), hopper=False)]
    assert "padded_aten_mm" in named and "padded_triton_mm" not in named
    head = [t.uid for t in active_templates(_problem(256, 768, 50257, b_col=True, device="cuda:0"), None, hopper=False)]
    assert "padded_aten_mm" in head and "triton_mm" in head and "padded_triton_mm" not in head  # no duplicate
    pool = [AtenTemplate("mm")]  # a pool the caller lists is used as it is
    assert [t.uid for t in active_templates(_gpu_problem(777, 1234, 5555), None, pool)] == ["aten_mm"]


def test_the_catalog_knows_a_padded_twin_by_its_template():
    problem = "mm(777x1234, 1234x5555)/bfloat16/0123456789abcdef"
    tile = '{"BLOCK_K":64,"BLOCK_M":128,"BLOCK_N":128,"num_stages":3,"num_warps":8}'
    assert catalog_fault(Row("padded_triton_mm", "h", tile, '{"swizzle":8}', 1.0, "ok"), problem) is None
    assert "not one gemmtune ships" in catalog_fault(Row("padded_mine", "h", "{}", "{}", 1.0, "ok"), problem)


def test_a_tune_with_a_padded_twin_times_it_and_returns_the_product():
    a, b = torch.randn(37, 29), torch.randn(29, 23)
    pool = [AtenTemplate("mm"), PaddedTemplate(AtenTemplate("mm"))]
    sel = gemmtune.tune("mm", a, b, backends=("extern",), templates=pool)
    timed = {t.choice.template_uid: t for t in sel.timings}
    assert timed["padded_aten_mm"].status == "ok" and timed["padded_aten_mm"].ms is not None
    assert not timed["padded_aten_mm"].choice.is_extern  # held to the rules of a generated kernel
    torch.testing.assert_close(sel(a, b), a @ b)
    launch = PaddedTemplate(AtenTemplate("mm")).compile(
        Choice("padded_aten_mm", None), sel.problem, (a, b))  # the winner, or not: both compute the product
    torch.testing.assert_close(launch((a, b)), a @ b)


def test_the_padded_library_kernel_always_reaches_the_final_as_the_library_kernel_does():
    from gemmtune.core.choices import Timing, as_params
    from gemmtune.search.final import FinalRule, final_decision
    from gemmtune.search.prescreen import PrescreenOptions, prescreen

    lib, twin = Choice("aten_mm", None), Choice("padded_aten_mm", "h")
    tiles = [Choice("triton_mm", "t", as_params({"BLOCK_M": b}), as_params({"swizzle": 8}), family="triton")
             for b in (16, 32, 64, 128)]
    times = {lib: 1.0, twin: 0.7, **{c: 0.8 + 0.01 * i for i, c in enumerate(tiles)}}
    measured = []
    ranked = prescreen([lib, twin, *tiles], lambda cs, stage: measured.extend((c, stage) for c in cs)
                       or [times[c] for c in cs], PrescreenOptions(top_x=1))
    assert (twin, "final") in measured and (twin, "prescreen") not in measured  # timed once, with the library
    records = {t.choice: t for t in ranked}
    retimed = []
    slow_twin = [Timing(c, 0.95 if c == twin else records[c].ms, "final") for c in records]  # 3rd-best now
    decision = final_decision(sorted(slow_twin, key=lambda t: t.ms), {t.choice: t for t in slow_twin},
                              lambda cs, rounds: retimed.extend(cs) or [times[c] for c in cs],
                              FinalRule(finalists=1, rounds=3, library_margin=0.01))
    assert twin in retimed and lib in retimed and decision.choice == twin


def test_a_tma_twin_keeps_n_and_writes_the_output_itself():
    from gemmtune.templates.triton.tma import TritonTMAPersistentTemplate

    twin = PaddedTemplate(TritonTMAPersistentTemplate())
    assert twin.keep_n is True  # an output row TMA cannot store is stored through pointers
    for b_col in (True, False):
        big = padded_problem(_problem(777, 1234, 5555, b_col=b_col, device="cuda"), keep_n=True)
        assert (big.K, big.N) == (1280, 5555) and big.b.stride == ((1, 1280) if b_col else (5568, 1))
    a, b = torch.randn(40, 13, dtype=torch.float16), torch.randn(13, 21, dtype=torch.float16)  # K 13 -> 16, N 21 kept
    tile = dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, num_stages=3, num_warps=4, EPILOGUE_SUBTILE=0)
    launch, rt = _launch(TritonTMAPersistentTemplate(space=[tile], num_sms=2), "mm", a, b)
    out = torch.full((40, 21), float("nan"), dtype=torch.float16)
    got = launch((a, b), out, **rt)
    assert got.data_ptr() == out.data_ptr()  # no block copied out
    torch.testing.assert_close(got.float(), a.float() @ b.float(), rtol=2e-3, atol=2e-3)




@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_a_padded_launch_binds_to_its_problem_through_its_inner_kernels_binding(op):
    from gemmtune.templates.padded import padded_launcher

    a, b = torch.randn(13, 21), torch.randn(21, 19)
    tensors = (torch.randn(19), a, b) if op == "addmm" else (a, b)
    ki = KernelInputs.from_tensors(op, *tensors)
    dims = padding_dims(ki)
    inner_ki = padded_problem(ki, dims)
    aten = AtenTemplate(op).compile(Choice(f"aten_{op}", None), inner_ki, ())
    calls = []

    def inner(args, out=None):  # the generic path: counted, never taken by the bound call
        calls.append("generic")
        return aten(args, out)

    bindings = []
    inner.bound = lambda args: bindings.append([tuple(t.shape) for t in args]) or aten.bound(args)
    launch = padded_launcher(ki, dims, inner)
    bound = launch.bound(tensors)
    assert bindings == [[tuple(t.size) for t in inner_ki.operands]]  # bound to the padded problem
    calls.clear()
    again = tuple(torch.randn_like(t) for t in tensors)
    want = torch.addmm(*again) if op == "addmm" else again[0] @ again[1]
    got = bound(*again)
    assert got.shape == (13, 19) and got.is_contiguous()
    torch.testing.assert_close(got, want)
    out = torch.full((13, 19), float("nan"))
    assert bound(*again, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, want)
    assert calls == []
    inner.bound = lambda args: None  # an inner kernel that declines: so does the padded launch
    assert launch.bound(tensors) is None


def test_a_bound_padded_launch_whose_kernel_writes_the_output_itself_writes_out():
    a, b = torch.randn(13, 21), torch.randn(21, 20)  # float32: only K is padded (to 24), so N stays
    ki = KernelInputs.from_tensors("mm", a, b)
    assert padding_dims(ki) == {"K": 24}
    launch, rt = _launch(AtenTemplate("mm"), "mm", a, b)
    bound = launch.bound((a, b), **rt)
    out = torch.full((13, 20), float("nan"))
    assert bound(a, b, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, a @ b)
