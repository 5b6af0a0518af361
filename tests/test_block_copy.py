"""`staging.block_copy` and its Triton kernel (`templates.triton.copy_kernel`, run by Triton's interpreter on
CPU): an operand copied bit for bit into the top-left block of zero-padded storage and back out, in either
orientation and batched; the padding is never written; what the kernel declines torch copies."""

from __future__ import annotations

import pytest
import torch

from gemmtune.templates import staging
from gemmtune.templates.staging import block_copy, kernel_copy, packed


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _operand(shape, dtype):
    return torch.randn(shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_an_operand_is_copied_bit_for_bit_into_its_padded_block_and_the_padding_stays_zero(dtype):
    src, padded = _operand((37, 55), dtype), torch.zeros(40, 64).to(dtype)
    assert kernel_copy(padded[:37, :55], src)
    assert torch.equal(_bits(padded[:37, :55]), _bits(src))
    assert not _bits(padded[37:]).any() and not _bits(padded[:, 55:]).any()


def test_a_column_major_operand_is_copied_in_its_own_orientation():
    src = _operand((55, 37), torch.bfloat16).mT  # [37, 55] with strides (1, 37)
    padded = torch.zeros(64, 40, dtype=torch.bfloat16).mT  # column-major storage, 40 x 64
    assert kernel_copy(padded[:37, :55], src)
    assert torch.equal(padded[:37, :55], src) and not padded[:, 55:].any()


def test_a_batch_of_matrices_is_copied_matrix_by_matrix():
    src, padded = _operand((3, 9, 13), torch.float16), torch.zeros(3, 16, 16, dtype=torch.float16)
    assert kernel_copy(padded[:, :9, :13], src)
    assert torch.equal(padded[:, :9, :13], src) and not padded[:, 9:].any() and not padded[:, :, 13:].any()


def test_a_padded_output_block_is_copied_out_into_packed_rows():
    full = _operand((40, 64), torch.bfloat16)
    out = torch.empty(37, 55, dtype=torch.bfloat16)
    assert kernel_copy(out, full[:37, :55])
    assert torch.equal(out, full[:37, :55])


def test_the_kernel_declines_what_it_cannot_copy_and_writes_nothing():
    dst = torch.zeros(8, 16)
    assert not kernel_copy(dst[:, :5], torch.ones(16, 8)[:5].mT)  # packed on neither side
    assert not kernel_copy(dst[:5, :5], torch.ones(5, 5, dtype=torch.float64).to(torch.bfloat16))  # dtypes differ
    assert not kernel_copy(dst[:, :4], torch.ones(8, 5))  # shapes differ
    assert not dst.any()


def test_block_copy_on_the_cpu_is_torchs_copy(monkeypatch):
    monkeypatch.setattr(staging, "kernel_copy", lambda *a: pytest.fail("the kernel runs only on a GPU"))
    dst = torch.zeros(4, 8)
    assert block_copy(dst[:, :3], torch.ones(4, 3)) is not None
    assert dst[:, :3].all() and not dst[:, 3:].any()
    block = torch.arange(32.0).view(4, 8)[:, :3]
    assert packed(block).is_contiguous() and torch.equal(packed(block), block)


def test_a_copy_that_needs_gradients_or_lies_off_the_gpu_is_left_to_torch():
    grad = torch.ones(64, 64, requires_grad=True)
    assert not staging._kernel_copy(torch.zeros(64, 64), grad)
    assert not staging._kernel_copy(torch.zeros(1024, 1024), torch.ones(1024, 1024))  # the CPU
