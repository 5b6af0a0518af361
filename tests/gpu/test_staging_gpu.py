"""Kept padded storage on a GPU (gemmtune.templates.staging): a storage per CUDA stream, none kept while a
CUDA graph is captured (the graph pads into its own memory, replayed correctly), none from a graph's
private pool, and a padded Triton twin bound to its problem."""

from __future__ import annotations

import pytest
import torch

from gemmtune.core.inputs import KernelInputs
from gemmtune.templates import staging
from gemmtune.templates.extern import AtenTemplate
from gemmtune.templates.padded import PaddedTemplate

BF16 = torch.bfloat16


def _close(got, a, b):
    """Within 2e-2 of the float product: a padded problem (K 1234 -> 1280) may sum in another order than
    `a @ b`, so an output near zero differs in its last bits; a wrong pad would be off by several units."""
    torch.testing.assert_close(got.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)


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
    _close(got, a, b)
    _close(got_side, a, b)
    kept = staging.kept_bytes()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = launch((a, b), None)
    assert staging.kept_bytes() == kept  # nothing kept from inside the capture
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    _close(out, a, b)


def test_a_padded_triton_twin_binds_to_its_problem_and_computes_the_product():
    from gemmtune.templates.triton.mm import TritonMMTemplate

    a, b = torch.randn(777, 1234, device="cuda", dtype=BF16), torch.randn(1234, 555, device="cuda", dtype=BF16)
    tile = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_stages=3, num_warps=4)
    ki = KernelInputs.from_tensors("mm", a, b)
    twin = PaddedTemplate(TritonMMTemplate(space=[tile]))
    choice = twin.configs(ki)[0]
    launch = twin.compile(choice, ki, (a, b))
    bound = launch.bound((a, b), **choice.runtime_dict)
    assert bound is not None
    a2 = torch.randn_like(a)
    _close(bound(a2, b), a2, b)


def test_kept_storage_never_comes_from_a_pool_the_calling_thread_is_routed_to():
    # torch.compile's CUDA graphs route their warm-up's allocations by thread, as `use_mem_pool` does
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
        pytest.skip("this torch has no memory pools of its own")
    staging.forget()
    pad = staging.staged_padder(True, 64, 1280, lambda t: None, "a")
    a = torch.randn(64, 1234, device="cuda", dtype=BF16)
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        kept = pad(a)
        routed = torch.empty(1 << 20, device="cuda")  # a plain allocation here is the pool's
    torch.cuda.synchronize()

    def pool_of(ptr):
        return next(tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()
                    if s["address"] <= ptr < s["address"] + s["total_size"])

    assert pool_of(routed.data_ptr()) == tuple(pool.id) != pool_of(kept.data_ptr())
    torch.testing.assert_close(kept[:, :1234], a)
    torch.testing.assert_close(kept[:, 1234:], torch.zeros(64, 46, device="cuda", dtype=BF16))
