"""`staging.block_copy` on a GPU: a misaligned bf16 operand is copied into its padded storage by the Triton
kernel (not torch's copy), bit for bit, inside and outside a CUDA graph; a small one is left to torch; a
padded launch copies its output block out with it."""

from __future__ import annotations

import torch

from gemmtune.core.inputs import KernelInputs
from gemmtune.templates import staging
from gemmtune.templates.extern import AtenTemplate
from gemmtune.templates.padded import PaddedTemplate

BF16 = torch.bfloat16


def _counted(monkeypatch):
    runs = []
    real = staging.kernel_copy
    monkeypatch.setattr(staging, "kernel_copy", lambda d, s: runs.append(s.shape) or real(d, s))
    return runs


def test_a_large_misaligned_operand_is_copied_by_the_kernel_bit_for_bit(monkeypatch):
    runs = _counted(monkeypatch)
    src = torch.randn(1234, 5555, device="cuda", dtype=BF16)
    padded = torch.zeros(1280, 5568, device="cuda", dtype=BF16)
    staging.block_copy(padded[:1234, :5555], src)
    assert runs == [src.shape]
    assert torch.equal(padded[:1234, :5555], src) and not padded[1234:].any() and not padded[:, 5555:].any()


def test_a_small_copy_is_torchs(monkeypatch):
    runs = _counted(monkeypatch)
    dst = torch.zeros(64, 72, device="cuda", dtype=BF16)
    staging.block_copy(dst[:, :70], torch.ones(64, 70, device="cuda", dtype=BF16))
    assert runs == [] and dst[:, :70].all() and not dst[:, 70:].any()


def test_the_kernel_copies_inside_a_captured_cuda_graph():
    src = torch.randn(777, 1234, device="cuda", dtype=BF16)
    padded = torch.zeros(777, 1280, device="cuda", dtype=BF16)
    staging._BOUND.clear()
    staging.block_copy(padded[:, :1234], src)  # compiled before the capture
    padded.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        staging.block_copy(padded[:, :1234], src)
    src.copy_(torch.randn_like(src))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(padded[:, :1234], src) and not padded[:, 1234:].any()


def test_a_padded_launch_copies_its_block_out_with_the_kernel(monkeypatch):
    a = torch.randn(777, 1234, device="cuda", dtype=BF16)
    b = torch.randn(1234, 5555, device="cuda", dtype=BF16)
    ki = KernelInputs.from_tensors("mm", a, b)
    t = PaddedTemplate(AtenTemplate("mm"))
    launch = t.compile(t.configs(ki)[0], ki, (a, b))
    runs = _counted(monkeypatch)
    got = launch((a, b))
    assert got.is_contiguous() and got.shape == (777, 5555)
    assert len(runs) == 3  # A and B into their padded storage, the output's block out
    torch.testing.assert_close(got.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)


def test_each_copy_is_compiled_once_and_then_launched_bound_to_its_shapes():
    staging._BOUND.clear()
    src = torch.randn(777, 1234, device="cuda", dtype=BF16)
    padded = torch.zeros(777, 1280, device="cuda", dtype=BF16)
    for _ in range(3):
        staging.block_copy(padded[:, :1234], src)
    (bound,) = staging._BOUND.values()
    assert bound is not None  # launched bound to the copy: the direct path, not Triton's JIT
    assert bound((src,), padded[:, :1234])
    assert torch.equal(padded[:, :1234], src)


def test_a_copy_first_met_inside_a_capture_is_left_to_torch():
    staging._BOUND.clear()
    src = torch.randn(513, 1234, device="cuda", dtype=BF16)
    padded = torch.zeros(513, 1280, device="cuda", dtype=BF16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        staging.block_copy(padded[:, :1234], src)
    assert not staging._BOUND  # nothing compiled or loaded during the capture
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(padded[:, :1234], src) and not padded[:, 1234:].any()
