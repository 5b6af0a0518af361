"""scaled_mm (torch._scaled_mm): semantics, typed bad inputs, the fp8 correctness gate, the store.

Real kernels on CPU: torch's own `torch._scaled_mm` (the library template) on small shapes.
"""

from __future__ import annotations

import pytest
import torch

import gemmtune
from gemmtune.core.choices import Choice
from gemmtune.core.inputs import KernelInputs
from gemmtune.measure.correctness import Reference, tolerance, verdict
from gemmtune.templates.base import Template
from gemmtune.templates.extern import AtenScaledMMTemplate
from gemmtune.templates.registry import active_templates

from helpers import fp8_operands

E4M3, E5M2, BF16 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
M, K, N = 32, 64, 48


def quantised(rowwise: bool, a_dtype: torch.dtype = E4M3):
    """(a, b, scale_a, scale_b) of this file's problem, quantised as torchao does (tests/helpers.py)."""
    return fp8_operands(M, K, N, rowwise, a_dtype)


def torch_scaled(tensors, out_dtype=BF16, fast=False):
    bias = tensors[4] if len(tensors) > 4 else None
    return torch._scaled_mm(*tensors[:4], bias=bias, out_dtype=out_dtype, use_fast_accum=fast)


# -- semantics --------------------------------------------------------------------------------------

@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
def test_scaled_mm_computes_what_torch_computes(rowwise, with_bias):
    tensors = quantised(rowwise)
    bias = torch.randn(N).to(BF16) if with_bias else None
    out = gemmtune.scaled_mm(*tensors, bias=bias)
    want = torch_scaled(tensors + ((bias,) if with_bias else ()))
    assert out.dtype == BF16 and out.shape == (M, N)
    assert torch.equal(out, want)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, BF16])
def test_out_dtype_and_e5m2_a(out_dtype):
    tensors = quantised(False, a_dtype=E5M2)
    out = gemmtune.scaled_mm(*tensors, out_dtype=out_dtype)
    assert out.dtype == out_dtype and torch.equal(out, torch_scaled(tensors, out_dtype))


def test_the_problem_key_holds_scales_out_dtype_fast_accum_and_bias():
    tw, rw = quantised(False), quantised(True)
    keys = {KernelInputs.from_tensors("scaled_mm", *tw).problem_key,
            KernelInputs.from_tensors("scaled_mm", *rw).problem_key,
            KernelInputs.from_tensors("scaled_mm", *tw, out_dtype=torch.float32).problem_key,
            KernelInputs.from_tensors("scaled_mm", *tw, fast_accum=True).problem_key,
            KernelInputs.from_tensors("scaled_mm", *tw, torch.zeros(N, dtype=BF16)).problem_key}
    assert len(keys) == 5
    ki = KernelInputs.from_tensors("scaled_mm", *rw, torch.zeros(N, dtype=BF16), fast_accum=True)
    assert ki.describe() == f"scaled_mm({M}x{K}, {K}x{N}, rowwise, bias {N}, bfloat16, fast_accum)"
    assert (ki.scales, ki.result_dtype, ki.dtype, ki.bias.size) == ("rowwise", BF16, E4M3, (N,))


def test_the_mm_ops_keep_their_keys_and_refuse_scaled_mm_options():
    a, b = torch.randn(4, 3), torch.randn(3, 2)
    ki = KernelInputs.from_tensors("mm", a, b)
    assert "out_dtype" not in ki.to_dict() and ki.result_dtype == torch.float32
    with pytest.raises(gemmtune.InputError, match="belong to scaled_mm only"):
        KernelInputs.from_tensors("mm", a, b, fast_accum=True)


# -- bad input: torch's rules, typed ------------------------------------------------------------------

def _bad_cases():
    a, b, sa, sb = quantised(False)
    ar, br, sar, sbr = quantised(True)
    one = torch.tensor(1.0)
    return {
        "a not fp8": ((a.to(BF16), b, sa, sb), {}, "a must be float8"),
        "both e5m2": ((a.to(E5M2), b.to(E5M2), sa, sb), {}, "both float8_e5m2"),
        "a 3-D": ((a.unsqueeze(0), b, sa, sb), {}, "a must be a matrix"),
        "K differs": ((a, torch.zeros(N, K + 16).to(E4M3).t(), sa, sb), {}, "cannot be multiplied"),
        "b row-major": ((a, b.contiguous(), sa, sb), {}, "b must be column-major"),
        "a column-major": ((a.t().contiguous().t(), b, sa, sb), {}, "a must be row-major"),
        "K not a multiple of 16": ((torch.zeros(M, 24).to(E4M3), torch.zeros(N, 24).to(E4M3).t(), sa, sb), {},
                                   "multiples of 16"),
        "N not a multiple of 16": ((a, torch.zeros(20, K).to(E4M3).t(), sa, sb), {}, "multiples of 16"),
        "scale not float32": ((a, b, sa.to(BF16), sb), {}, "scale_a must be float32"),
        "scales mixed": ((ar, br, one, sbr), {}, "invalid scales"),
        "row-wise scales transposed": ((ar, br, sar.t(), sbr.t()), {}, "invalid scales"),
        "row-wise scales strided": ((ar, br, torch.ones(M, 2)[:, :1], sbr), {}, "must be contiguous"),
        "row-wise with float32 out": ((ar, br, sar, sbr), {"out_dtype": torch.float32}, "need out_dtype=torch.bfloat16"),
        "fp8 out": ((a, b, sa, sb), {"out_dtype": E4M3}, "does not tune float8 outputs"),
        "fast accum not bool": ((a, b, sa, sb), {"use_fast_accum": 1}, "use_fast_accum must be a bool"),
        "bias 2-D": ((a, b, sa, sb), {"bias": torch.zeros(M, N, dtype=BF16)}, "bias must be 1-D"),
        "bias of another dtype": ((a, b, sa, sb), {"bias": torch.zeros(N)}, "bias must be torch.bfloat16"),
        "bias with float32 out": ((a, b, sa, sb), {"bias": torch.zeros(N), "out_dtype": torch.float32},
                                  "not supported when out_dtype is torch.float32"),
        "not a tensor": ((a, b, 1.0, sb), {}, "scale_a must be a torch.Tensor"),
        "meta": ((a.to("meta"), b.to("meta"), sa, sb), {}, "meta device"),
    }


def test_one_row_with_row_wise_scales_is_a_row_wise_problem():
    """M = 1: scale_a [1, 1] holds one element as a tensor-wise scale does, but scale_b [1, N] still
    scales each column: the problem is row-wise (its kind, description and key say so)."""
    a, b, sa, sb = fp8_operands(1, K, N, True)
    ki = KernelInputs.from_tensors("scaled_mm", a, b, sa, sb)
    assert sa.shape == (1, 1) and ki.scales == "rowwise" and "rowwise" in ki.describe()
    tensorwise = KernelInputs.from_tensors("scaled_mm", a, b, sa.reshape(()), sb[:, :1].reshape(()))
    assert tensorwise.scales == "tensorwise" and tensorwise.problem_key != ki.problem_key


def test_row_wise_scales_take_the_output_dtypes_torch_takes_on_the_device(monkeypatch):
    """bf16 everywhere (the CPU keeps the GPUs' common rule); on a CUDA device also what torch's kernel
    there takes (`rowwise_out_dtypes`, asked of torch): the validator follows that answer."""
    from gemmtune.core import validate_fp8

    ar, br, sar, sbr = quantised(True)
    assert validate_fp8.rowwise_out_dtypes(torch.device("cpu")) == (BF16,)
    with pytest.raises(gemmtune.InputError, match="need out_dtype=torch.bfloat16, got torch.float16"):
        validate_fp8.validate_scaled_mm((ar, br, sar, sbr), torch.float16, False)
    monkeypatch.setattr(validate_fp8, "rowwise_out_dtypes", lambda device: (BF16, torch.float16))
    validate_fp8.validate_scaled_mm((ar, br, sar, sbr), torch.float16, False)  # a device whose torch takes it
    with pytest.raises(gemmtune.InputError, match="got torch.float32"):
        validate_fp8.validate_scaled_mm((ar, br, sar, sbr), torch.float32, False)
    meta = [t.to("meta") for t in (ar, br, sar, sbr)]
    with pytest.raises(gemmtune.InputError, match="need out_dtype"):  # no device to ask: the common rule
        validate_fp8.check_rules(meta, torch.float16, False)


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_every_bad_input_is_a_typed_error_naming_it(case):
    tensors, kwargs, needle = _bad_cases()[case]
    with pytest.raises(gemmtune.InputError, match=needle):
        gemmtune.scaled_mm(*tensors, **kwargs)
    with pytest.raises(gemmtune.InputError, match=needle):  # tune says the same
        bias = kwargs.get("bias")
        gemmtune.tune("scaled_mm", *tensors, *(() if bias is None else (bias,)), out_dtype=kwargs.get("out_dtype"),
                      use_fast_accum=kwargs.get("use_fast_accum", False))


def test_an_empty_problem_is_computed_by_torch_and_not_tuned():
    _, b, sa, sb = quantised(False)
    tensors = (torch.zeros(0, K).to(E4M3), b, sa, sb)
    out = gemmtune.scaled_mm(*tensors)
    assert out.shape == (0, N) and gemmtune.dispatch_stats()["tunes"] == 0
    with pytest.raises(gemmtune.InputError, match="nothing to tune"):
        gemmtune.tune("scaled_mm", *tensors)


# -- the correctness gate ---------------------------------------------------------------------------

class UnscaledTemplate(Template):
    """Deliberately wrong: multiplies the fp8 data but forgets the scales."""

    uid, family, src_hash, ops = "test_unscaled", "extern", None, ("scaled_mm",)

    def supports(self, ki):
        return True

    def compile(self, choice, ki, example):
        def launch(tensors, out=None):
            one = torch.tensor(1.0)
            res = torch._scaled_mm(tensors[0], tensors[1], one, one, out_dtype=ki.result_dtype)
            return res if out is None else out.copy_(res)

        return launch


def test_tolerance_comes_from_the_output_dtype_and_fast_accumulation():
    tw = quantised(False)
    tol = {fast: tolerance(KernelInputs.from_tensors("scaled_mm", *tw, fast_accum=fast)) for fast in (False, True)}
    assert tol[False] == pytest.approx(2e-2 + 2.5e-4) and tol[True] > tol[False]
    # float32's 1e-4, plus what Hopper's fp8 tensor cores lose without fast accumulation (cuBLASLt: 1.28e-4)
    assert tolerance(KernelInputs.from_tensors("scaled_mm", *tw, out_dtype=torch.float32)) == pytest.approx(3.5e-4)


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_the_gate_passes_torch_and_refuses_a_wrong_kernel(rowwise):
    tensors = quantised(rowwise)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors)
    ref = Reference.of(ki, tensors)
    assert ref.exact.dtype == torch.float64
    assert verdict(ki, torch_scaled(tensors), ref) is None
    wrong = UnscaledTemplate().compile(Choice("test_unscaled", None), ki, tensors)(tensors)
    assert verdict(ki, wrong, ref) is not None


def test_float32_output_passes_the_tight_gate():
    tensors = quantised(False)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=torch.float32)
    assert verdict(ki, torch_scaled(tensors, torch.float32), Reference.of(ki, tensors)) is None


def test_a_tune_excludes_the_wrong_candidate_and_picks_torch():
    tensors = quantised(True)
    sel = gemmtune.tune("scaled_mm", *tensors, templates=[AtenScaledMMTemplate(), UnscaledTemplate()])
    status = {t.choice.template_uid: t.status for t in sel.timings}
    assert status == {"aten_scaled_mm": "ok", "test_unscaled": "wrong_result"}
    assert sel.winner.template_uid == "aten_scaled_mm"
    assert torch.equal(sel(*tensors), torch_scaled(tensors))
    with pytest.raises(gemmtune.InputError, match="this Selection was tuned for"):
        sel(*quantised(False))


def test_only_templates_declaring_the_op_are_offered():
    ki = KernelInputs.from_tensors("scaled_mm", *quantised(False))
    assert [t.uid for t in active_templates(ki, None)] == ["aten_scaled_mm"]
    mm = KernelInputs.from_tensors("mm", torch.randn(4, 4), torch.randn(4, 4))
    assert "aten_scaled_mm" not in [t.uid for t in active_templates(mm, ("extern",))]


# -- the store --------------------------------------------------------------------------------------

def test_second_tune_is_a_store_hit_and_fast_accum_is_another_problem():
    tensors = quantised(True)
    first = gemmtune.tune("scaled_mm", *tensors)
    again = gemmtune.tune("scaled_mm", *tensors)
    fast = gemmtune.tune("scaled_mm", *tensors, use_fast_accum=True)
    assert (first.cache_hit, again.cache_hit, fast.cache_hit) == (False, True, False)
    assert again.winner == first.winner
    assert torch.equal(fast(*tensors), torch_scaled(tensors, fast=True))
    assert "scaled_mm(32x64, 64x48, rowwise, bfloat16)" in gemmtune.autotune_table(first)


def test_a_worker_rebuilds_the_problem_with_its_out_dtype_and_fast_accum():
    from gemmtune.core.settings import Settings
    from gemmtune.measure.jobs import Setup, WorkerState

    tensors = quantised(False)
    state = WorkerState()
    Setup("scaled_mm", tensors, 1.0, 1.0, (AtenScaledMMTemplate(),), Settings(), None, "cpu",
          (("out_dtype", torch.float32), ("fast_accum", True))).run(state)
    runner = state.require()
    assert (runner.ki.result_dtype, runner.ki.fast_accum) == (torch.float32, True)
    assert runner.check(Choice("aten_scaled_mm", None)) is None


def test_the_json_form_names_the_fp8_problem():
    from gemmtune.report import selection_dict

    doc = selection_dict(gemmtune.tune("scaled_mm", *quantised(True)))
    assert doc["winner"] == "aten_scaled_mm"
    assert {k: doc["problem"][k] for k in ("op", "out_dtype", "fast_accum", "scales", "M", "K", "N")} == {
        "op": "scaled_mm", "out_dtype": "bfloat16", "fast_accum": False, "scales": "rowwise", "M": M, "K": K, "N": N}


def test_the_library_kernel_is_handed_a_strided_bias_as_a_contiguous_copy(monkeypatch):
    """torch 2.11's cuBLASLt `_scaled_mm` reads a strided 1-D bias as contiguous (wrong by 0.16-0.19 on
    an H200): the tune and the dispatched call both give torch's op a contiguous copy."""
    real, seen = torch._scaled_mm, []

    def recording(*args, **kwargs):
        bias = kwargs.get("bias")
        seen.append(None if bias is None else bias.is_contiguous())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    a, b, sa, sb = fp8_operands(8, 32, 16, False)
    bias = (torch.randn(32) * 4).to(torch.bfloat16)[::2]
    out = gemmtune.scaled_mm(a, b, sa, sb, bias, backends=("extern",))
    again = gemmtune.scaled_mm(a, b, sa, sb, bias, backends=("extern",))
    want = real(a, b, sa, sb, bias=bias.contiguous(), out_dtype=torch.bfloat16)
    assert torch.equal(out, want) and torch.equal(again, want)
    assert seen and all(seen), seen  # every call torch's op saw had a contiguous bias
