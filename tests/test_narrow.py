"""Narrow problems (a huge M against N and K of 16-128, the vision models' convolutions as GEMMs): the
tiles offered, the stride alignment the mm kernel is told, and its results through Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.triton.mm import TritonMMTemplate, narrow_configs, stride_divisors


def test_a_narrow_problem_gets_whole_side_tiles_and_a_square_one_none():
    tiles = {(c["BLOCK_M"], c["BLOCK_N"]) for c in narrow_configs(401408, 20, 72)}
    assert tiles == {(64, 32), (128, 32), (256, 32), (512, 32)}
    assert {c["BLOCK_K"] for c in narrow_configs(401408, 20, 72)} == {32, 128}
    assert {(c["BLOCK_M"], c["BLOCK_N"]) for c in narrow_configs(16, 500000, 64)} >= {(16, 512)}  # its transpose
    assert narrow_configs(4096, 4096, 4096) == [] and narrow_configs(8192, 32, 16) == []
    fitted = TritonMMTemplate().compile_configs(KernelInputs.from_tensors("mm", torch.empty(20000, 16),
                                                                          torch.empty(16, 24)))
    assert any(c["BLOCK_M"] == 512 and c["num_warps"] == 8 for c in fitted)


@pytest.mark.parametrize("k,n", [(72, 20), (20, 72), (24, 40), (64, 64)])
def test_the_kernel_is_told_each_strides_alignment_and_computes_the_product(k, n):
    a, w = torch.randn(70, k), torch.randn(n, k)
    ki = KernelInputs.from_tensors("mm", a, w.t())
    divs = stride_divisors(ki)
    assert divs["DIV_AM"] == (16 if k % 16 == 0 else k & -k) and divs["DIV_AK"] == 1 and divs["DIV_BK"] == 1
    tile = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_stages=2, num_warps=4)
    t = TritonMMTemplate(space=[tile])
    choice = t.configs(ki)[0]
    launch = t.compile(choice, ki, (a, w.t()))
    torch.testing.assert_close(launch((a, w.t()), None, **choice.runtime_dict), a @ w.t(), rtol=1e-4, atol=1e-4)


def test_a_binary_refuses_strides_it_would_misread():
    a, b = torch.randn(16, 24), torch.randn(24, 16)
    ki = KernelInputs.from_tensors("mm", a, b)
    t = TritonMMTemplate(space=[dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2, num_warps=4)])
    launch = t.compile(t.configs(ki)[0], ki, (a, b))
    odd = torch.randn(16, 27)[:, :24]  # rows 27 apart: not the multiple of 8 the binary assumes
    with pytest.raises(RuntimeError, match="not a multiple of the 8"):
        launch((odd, b))


def test_a_binary_told_its_output_rows_alignment_writes_any_output_right():
    """The output's row stride is a constexpr multiple too (N = 24: rows 16-byte aligned in bf16, stored in
    vectors).  A row-major output, or a wider one whose rows keep that alignment, is written in place; one
    whose rows break it (a column-major output, rows 27 apart) is written through a row-major one; the
    binary itself refuses arguments it would misread."""
    from gemmtune.templates.triton.mm import checked_strides
    a, b = torch.randn(40, 16), torch.randn(16, 24)
    ki = KernelInputs.from_tensors("mm", a, b)
    assert stride_divisors(ki)["DIV_CM"] == 8
    t = TritonMMTemplate(space=[dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, num_stages=2, num_warps=4)])
    launch = t.compile(t.configs(ki)[0], ki, (a, b))
    torch.testing.assert_close(launch((a, b)), a @ b, rtol=1e-4, atol=1e-4)
    wide = torch.zeros(40, 32)
    assert launch((a, b), wide[:, :24]).data_ptr() == wide.data_ptr()  # rows 32 apart: a multiple of 8
    torch.testing.assert_close(wide[:, :24], a @ b, rtol=1e-4, atol=1e-4)
    assert not wide[:, 24:].any()  # nothing past each row's N columns
    for out in (torch.zeros(40, 27)[:, :24], torch.zeros(24, 40).t()):
        assert launch((a, b), out) is out
        torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)
    meta = dict(HINT_M=16, DIV_AM=16, DIV_AK=1, DIV_BK=8, DIV_BN=1, DIV_CM=8)
    args = (None,) * 4 + (40, 24, 16, 0, 16, 1, 0, 24, 1, 0, 27, 1)
    with pytest.raises(RuntimeError, match=r"stride of 27 .* multiple of the 8 .*DIV_CM.*row-major output"):
        checked_strides(meta, args)
    assert checked_strides(meta, (None,) * 4 + (1,) + args[5:]) is not None  # one row: its stride is never used


def test_a_streaming_problem_gets_no_persistent_tma_configs_and_no_padded_twins():
    from gemmtune.templates.base import streaming
    from gemmtune.templates.extern import AtenTemplate
    from gemmtune.templates.padded import padded_pool
    from gemmtune.templates.triton.tma import TritonTMAPersistentTemplate

    bf16 = dict(dtype=torch.bfloat16)
    stem = KernelInputs.from_tensors("mm", torch.empty(16384, 147, **bf16), torch.empty(64, 147, **bf16).t())
    odd = KernelInputs.from_tensors("mm", torch.empty(777, 1234, **bf16), torch.empty(1234, 5555, **bf16))
    tall = KernelInputs.from_tensors("mm", torch.empty(16384, 16, **bf16), torch.empty(16, 1024, **bf16))
    square = KernelInputs.from_tensors("mm", torch.empty(4096, 64, **bf16), torch.empty(64, 4096, **bf16))
    head = KernelInputs.from_tensors("mm", torch.empty(8, 4096, **bf16), torch.empty(32001, 4096, **bf16).t())
    assert [streaming(ki.M, ki.N, ki.K) for ki in (stem, odd, tall, square, head)] == [True, False, True, False, False]
    pool = [AtenTemplate("mm"), TritonMMTemplate()]
    assert padded_pool(stem, pool, lambda t: True) == []  # K = 147 is misaligned, but a copy costs the GEMM
    assert [t.uid for t in padded_pool(odd, pool, lambda t: True)] == ["padded_aten_mm", "padded_triton_mm"]
    tma = TritonTMAPersistentTemplate()
    assert tma.compile_configs(tall) == [] and tma.compile_configs(square) != []
    assert [t.uid for t in padded_pool(head, pool, lambda t: True)] == ["padded_aten_mm"]  # a decode head: K = 4096
    assert tma.compile_configs(head) != []
