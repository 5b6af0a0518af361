"""Kept padded storage on a GPU (gemmtune.templates.staging): a storage per CUDA stream, and none kept
while a CUDA graph is captured (the graph pads into its own memory, replayed correctly)."""

from __future__ import annotations

import torch

from gemmtune.core.inputs import KernelInputs
from gemmtune.templates import staging
from gemmtune.templates.extern import AtenTemplate
from gemmtune.templates.padded import PaddedTemplate

BF16 = torch.bfloat16


def _launcher(a, b):
    ki = KernelInputs.from_tensors("mm", a, b)
    t = PaddedTemplate(AtenTemplate("mm"))
    return t.compile(t.configs(ki)[0], ki, (a, b))


def test_each_cuda_stream_gets_storage_of_its_own():
    staging.forget()
    pad = staging.staged_padder(True, 64, 1280, lambda t: None, "a")
    a = torch.randn(64, 1234, device="cuda", dtype=BF16)
    here = pad(a).data_ptr()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        there = pad(a).data_ptr()
    torch.cuda.synchronize()
    assert here != there and pad(a).data_ptr() == here


def test_a_padded_launch_on_two_streams_and_in_a_cuda_graph_computes_the_product():
    staging.forget()
    a, b = torch.randn(777, 1234, device="cuda", dtype=BF16), torch.randn(1234, 555, device="cuda", dtype=BF16)
    launch = _launcher(a, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got_side = launch((a, b), None)
    got = launch((a, b), None)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, a @ b)
    torch.testing.assert_close(got_side, a @ b)
    kept = staging.kept_bytes()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = launch((a, b), None)
    assert staging.kept_bytes() == kept  # nothing kept from inside the capture
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a @ b)
