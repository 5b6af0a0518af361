"""GPU tests of the hard shapes: padded twins on misaligned problems, whole-side tiles on narrow ones,
and the second timer (skipped without CUDA)."""

import pytest
import torch

import gemmtune
from gemmtune.core.choices import Choice
from gemmtune.core.inputs import KernelInputs
from gemmtune.measure.correctness import check, reference
from gemmtune.measure.runners import local_runner
from gemmtune.templates.extern import AtenTemplate
from gemmtune.templates.padded import PaddedTemplate
from gemmtune.templates.triton.mm import TritonMMTemplate
from gpu_operands import operands

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TILE = [dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_stages=3, num_warps=4),
        dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=3, num_warps=4)]


@pytest.mark.parametrize("b_layout", ["col", "row"])
@pytest.mark.parametrize("inner", ["aten", "triton"])
@pytest.mark.parametrize("op,shape", [("mm", (777, 1234, 5555)), ("addmm", (129, 1001, 383)), ("bmm", (65, 72, 20))])
def test_a_padded_twin_computes_the_product(inner, op, shape, b_layout):
    # A row-major B keeps N in the Triton twin: its padded rows are aligned, so the kernel loads them in
    # vectors, and the tile's wrap past the odd N must never split one (a misaligned address before).
    tensors = operands(op, *shape, torch.bfloat16, b_layout, **({"batch": 3} if op == "bmm" else {}))
    ki = KernelInputs.from_tensors(op, *tensors)
    t = PaddedTemplate(AtenTemplate(op) if inner == "aten" else TritonMMTemplate(space=TILE))
    ref = reference(ki, tensors)
    for choice in t.configs(ki)[::4]:
        out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype, device="cuda")
        t.compile(choice, ki, tensors)(tensors, out, **choice.runtime_dict)
        torch.cuda.synchronize()
        assert check(ki, out, ref) is None, choice.key


def test_operands_seen_through_aligned_storage_with_an_odd_edge_compute_the_product():
    a_store = torch.randn(1234, 784, dtype=torch.bfloat16, device="cuda")
    b_store = torch.randn(1234, 5568, dtype=torch.bfloat16, device="cuda")
    a, b = a_store[:, :777].t(), b_store[:, :5555]  # A column-major, B row-major: aligned rows, odd M and N
    ki = KernelInputs.from_tensors("mm", a, b)
    t = TritonMMTemplate(space=TILE)
    ref = reference(ki, (a, b))
    for choice in t.configs(ki)[::4]:
        out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype, device="cuda")
        t.compile(choice, ki, (a, b))((a, b), out, **choice.runtime_dict)
        torch.cuda.synchronize()
        assert check(ki, out, ref) is None, choice.key


def test_a_misaligned_tune_times_the_padded_twins_and_returns_the_product():
    a, b = operands("mm", 777, 1234, 5555, torch.bfloat16, "row")
    sel = gemmtune.tune("mm", a, b, settings=gemmtune.Settings(store="off"))
    twins = [t for t in sel.timings if t.choice.template_uid.startswith("padded_") and t.status == "ok"]
    assert twins, sorted({t.choice.template_uid for t in sel.timings})
    assert not [t.choice.key for t in sel.timings if t.status == "run_failed"]  # no candidate's run failed
    torch.testing.assert_close(sel(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=1.0)


def test_a_narrow_problem_is_offered_whole_side_tiles_and_computes_the_product():
    a, b = operands("mm", 200000, 72, 20, torch.bfloat16, "col")
    sel = gemmtune.tune("mm", a, b, settings=gemmtune.Settings(store="off"))
    tiles = {t.choice.config_dict.get("BLOCK_N") for t in sel.timings if t.choice.template_uid == "triton_mm"}
    assert 32 in tiles
    torch.testing.assert_close(sel(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=0.5)


def test_the_second_timer_reads_a_kernel_and_the_library():
    a, b = operands("mm", 1024, 1024, 1024, torch.bfloat16, "row")
    ki = KernelInputs.from_tensors("mm", a, b)
    aten = AtenTemplate("mm")
    launch = aten.compile(Choice("aten_mm", None), ki, (a, b))
    runner = local_runner(ki, (a, b), lambda c: launch, gemmtune.Settings(), None)
    timer, (one, two) = runner.second_opinion([Choice("aten_mm", None), Choice("aten_mm", None)])
    assert timer == "do_bench" and 0 < one < 10 and 0.5 < one / two < 2


@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_a_head_with_an_odd_n_writes_a_view_of_padded_rows_through_the_library(op):
    # out_layout="padded": rows of 16-byte-aligned stride, written by the library's kernels and their twins alone.
    tensors = operands(op, 1000, 768, 30522 + 1, torch.bfloat16, "col")
    ki = KernelInputs.from_tensors(op, *tensors)
    fn = gemmtune.mm if op == "mm" else gemmtune.addmm
    out = fn(*tensors, out_layout="padded")
    assert out.shape == ki.out_size and out.stride() == (30528, 1)
    assert check(ki, out, reference(ki, tensors)) is None
    sel = gemmtune.tune(op, *tensors, out_layout="padded", settings=gemmtune.Settings(store="off"), progress=False)
    assert {t.choice.template_uid.removeprefix("padded_") for t in sel.timings} <= {"aten_mm", "aten_addmm",
                                                                                     "aten_bias_addmm"}
