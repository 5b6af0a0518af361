"""GPU tests of `triton_skinny` (one-launch split-K for M <= 256) and the direct launch path;
skipped without CUDA.

    python -m pytest -v tests/gpu/test_skinny_gpu.py -s
"""

import time

import pytest
import torch

from gemmtune.measure.correctness import check, reference
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.triton.launch import FastLaunch
from gemmtune.templates.triton.mm import TritonMMTemplate
from gemmtune.templates.triton.skinny import TritonSkinnyTemplate
from gpu_operands import operands

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SPLITS = [dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=s, num_stages=4, num_warps=4) for s in (1, 3, 8)]
SPLITS.append(dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, SPLIT_K=4, num_stages=3, num_warps=4))


def check_configs(op, tensors, template, alpha=1.0, beta=1.0, repeat=3):
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    ref = reference(ki, tensors)
    n = 0
    for c in template.configs(ki):
        launch = template.compile(c, ki, tensors)
        for _ in range(repeat):  # counters must be back at 0 after every launch
            out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype, device="cuda")
            launch(tensors, out, **c.runtime_dict)
            torch.cuda.synchronize()
            assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))
        n += 1
    return n


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(1, 4096, 6144), (16, 14336, 4096), (128, 4096, 1000), (7, 1000, 999)])
def test_skinny_correct(dtype, b_layout, shape):
    assert check_configs("mm", operands("mm", *shape, dtype, b_layout), TritonSkinnyTemplate(space=SPLITS)) > 0


def test_skinny_addmm_bmm_default_space():
    t = TritonSkinnyTemplate()
    assert check_configs("addmm", operands("addmm", 16, 4096, 1000, torch.bfloat16, "col"), t, 0.5, 2.0, 1) > 10
    assert check_configs("bmm", operands("bmm", 3, 2048, 3000, torch.bfloat16, "col", batch=4), t, repeat=1) > 10


def test_skinny_deterministic_and_graph_safe():
    a, b = operands("mm", 16, 14336, 4096, torch.bfloat16, "col")
    ki = KernelInputs.from_tensors("mm", a, b)
    t = TritonSkinnyTemplate(space=[SPLITS[2]])
    c = t.configs(ki)[0]
    launch = t.compile(c, ki, (a, b))
    first = launch((a, b))
    for _ in range(20):
        assert torch.equal(launch((a, b)), first)  # sums partials in slice order: bitwise stable
    out = torch.empty_like(first)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch((a, b), out)  # warm up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch((a, b), out)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)


def test_skinny_two_streams_at_once():
    a, b = operands("mm", 1, 4096, 6144, torch.bfloat16, "col")
    ki = KernelInputs.from_tensors("mm", a, b)
    t = TritonSkinnyTemplate(space=[SPLITS[2]])
    launch = t.compile(t.configs(ki)[0], ki, (a, b))
    ref = launch((a, b))
    outs = [torch.empty_like(ref) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    for _ in range(10):
        for s, o in zip(streams, outs):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                launch((a, b), o)
        torch.cuda.synchronize()
        assert all(torch.equal(o, ref) for o in outs)


def _host_us(fn, calls=200):
    torch.cuda.synchronize()
    torch.cuda._sleep(int(5e-3 * 1.98e9))
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return dt


@pytest.mark.parametrize("template", [TritonMMTemplate, TritonSkinnyTemplate])
def test_direct_launch_is_used_and_cheaper(template, monkeypatch):
    a, b = operands("mm", 16, 4096, 4096, torch.bfloat16, "col")
    ki = KernelInputs.from_tensors("mm", a, b)
    t = template()
    c = t.configs(ki)[0]
    launch = t.compile(c, ki, (a, b))
    out = launch((a, b))
    calls = []
    orig_call = FastLaunch.__call__
    monkeypatch.setattr(FastLaunch, "__call__", lambda self, args: calls.append(orig_call(self, args)) or calls[-1])
    fast = _host_us(lambda: launch((a, b), out, **c.runtime_dict))
    assert calls and all(calls), "the direct launch path was not taken"
    monkeypatch.setattr(FastLaunch, "__call__", lambda self, args: False)
    jit = _host_us(lambda: launch((a, b), out, **c.runtime_dict))
    monkeypatch.setattr(FastLaunch, "__call__", lambda self, args: calls.append(orig_call(self, args)) or calls[-1])
    print(f"\n{t.uid}: host us per launch: direct {fast:.1f}, Triton JIT {jit:.1f}")
    ref = reference(ki, (a, b))
    assert check(ki, launch((a, b), out, **c.runtime_dict), ref) is None
    # A misaligned copy of A specialises differently: the JIT path must take it, and stay correct.
    a2 = torch.empty(a.numel() + 1, dtype=a.dtype, device="cuda")[1:].view_as(a)
    a2.copy_(a)
    assert a2.data_ptr() % 16 != 0
    calls.clear()
    assert check(ki, launch((a2, b), None, **c.runtime_dict), ref) is None
    assert calls == [False]  # declined: the JIT launched it
