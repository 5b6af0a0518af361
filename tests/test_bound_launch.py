"""The launch bound to one problem (`FastLaunch.bind`, `bound_launcher`, `bound_on_first_call`).

The binary's launcher is a recording fake: these tests check which arguments reach it, in which
positions, and when the binding declines (the caller then takes the general path).  The real
kernels run in tests/gpu/test_bound_launch_gpu.py.
"""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace as P

import pytest
import torch

from gemmtune.core.inputs import KernelInputs
from gemmtune.core.binding import bound_on_first_call
from gemmtune.templates.triton.base import KernelLaunch, bound_launcher
from gemmtune.templates.triton.launch import FastLaunch

CPU = -1  # what Tensor.get_device() says for a CPU tensor: the "device" the fake binary is loaded on


@pytest.fixture
def launches(monkeypatch):
    """(FastLaunch of a fake kernel (A, B, C, N, GROUP, BLOCK: constexpr), the launcher's calls)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: CPU)
    calls: list[tuple] = []
    kernel = P(params=[P(name=n, is_constexpr=False, do_not_specialize=n == "GROUP") for n in ("A", "B", "C", "N", "GROUP")]
               + [P(name="BLOCK", is_constexpr=True, do_not_specialize=False)])
    compiled = P(function="fn", packed_metadata="meta", run=lambda *a: calls.append(a))
    a, b, c = torch.ones(64), torch.ones(64), torch.ones(64)
    fast = FastLaunch.build(kernel, compiled, (3, 2), dict(BLOCK=32), (a, b, c, 64, 8), device=CPU)
    assert fast is not None
    fast._get_stream = lambda device: 7
    return fast, calls


def test_bound_changes_only_the_pointers(launches):
    fast, calls = launches
    a, b, out = torch.ones(64), torch.ones(64), torch.ones(64)
    bound = fast.bind((a, b, out, 64, 4), (a, b), out)
    assert bound is not None
    x, y, z = torch.zeros(64), torch.zeros(64), torch.zeros(64)
    assert bound((x, y), z)
    assert calls == [(3, 2, 1, 7, "fn", "meta", None, None, None, x.data_ptr(), y.data_ptr(), z.data_ptr(), 64, 4, 32)]


def test_bound_keeps_no_tensor_of_the_binding_call(launches):
    fast, _ = launches
    a, b, out = torch.ones(64), torch.ones(64), torch.ones(64)
    bound = fast.bind((a, b, out, 64, 4), (a, b), out)
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert bound is not None and ref() is None


def test_bound_declines_what_would_specialise_otherwise(launches, monkeypatch):
    fast, calls = launches
    a, b, out = torch.ones(64), torch.ones(64), torch.ones(64)
    bound = fast.bind((a, b, out, 64, 4), (a, b), out)
    assert bound is not None
    assert not bound((torch.ones(65)[1:], b), out)  # a misaligned operand
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    elsewhere = fast.bind((a, b, out, 64, 4), (a, b), out)
    assert elsewhere is not None and not elsewhere((a, b), out)  # another current device than the binary's
    fast._knobs = P(launch_enter_hook=lambda *_: None, launch_exit_hook=None)
    assert not bound((a, b), out)  # a profiler's launch hook: the JIT path calls it
    assert calls == []


def test_bind_refuses_what_it_cannot_map(launches):
    fast, _ = launches
    a, b, out = torch.ones(64), torch.ones(64), torch.ones(64)
    assert fast.bind((a, b, out, 65, 4), (a, b), out) is None  # N differs from the warm-up's
    assert fast.bind((a, b.view(64), out, 64, 4), (a, b), out) is None  # an argument that is no operand
    assert fast.bind((a, a, out, 64, 4), (a, a), out) is None  # one object as two operands


def test_bound_launcher_allocates_and_falls_back(launches):
    fast, calls = launches
    ki = KernelInputs.from_tensors("mm", torch.ones(4, 16), torch.ones(16, 16))
    general: list[tuple] = []

    def launch(tensors, out=None, swizzle=1):
        general.append((tensors, swizzle))
        return out

    args = lambda tensors, out, swizzle: (tensors[0], tensors[1], out, 64, swizzle)  # noqa: E731
    run = KernelLaunch(None, (3, 2, 1), {}, fast)
    a, b = torch.ones(4, 16), torch.ones(16, 16)
    bound = bound_launcher(ki, run, args, launch, (a, b), 5)
    assert bound is not None
    out = bound(a, b)
    assert out.shape == (4, 16) and out.dtype == a.dtype and general == []
    assert calls[-1][9:12] == (a.data_ptr(), b.data_ptr(), out.data_ptr()) and calls[-1][13] == 5
    odd = torch.ones(4 * 16 + 1)[1:].view(4, 16)  # same shape and strides, 4-byte offset
    bound(odd, b)
    assert len(general) == 1 and general[0][1] == 5  # declined: the general launch, same swizzle
    assert bound_launcher(ki, KernelLaunch(None, (1,), {}), args, launch, (a, b), 5) is None  # no direct path


def test_dispatch_entry_binds_once_with_the_first_operands():
    seen: list[tuple] = []

    def kernel(*tensors):
        return "general"

    kernel.bound = lambda *tensors: seen.append(tensors) or (lambda *t: "bound")  # type: ignore[attr-defined]
    cell = bound_on_first_call(kernel)
    assert [cell[0](1, 2), cell[0](3, 4)] == ["bound", "bound"] and seen == [(1, 2)]
    kernel.bound = lambda *tensors: None  # type: ignore[attr-defined]
    cell = bound_on_first_call(kernel)
    assert [cell[0](1, 2), cell[0](1, 2)] == ["general", "general"]
    assert bound_on_first_call(len)[0] is len  # nothing to bind


def test_bound_launcher_fetches_scratch_buffers_per_call(launches):
    fast, calls = launches
    ki = KernelInputs.from_tensors("mm", torch.ones(4, 16), torch.ones(16, 16))
    scratch = [torch.ones(8)]
    args = lambda tensors, out, swizzle: (tensors[0], scratch[0], out, 64, swizzle)  # noqa: E731
    a, b = torch.ones(4, 16), torch.ones(16, 16)
    bound = bound_launcher(ki, KernelLaunch(None, (3, 2, 1), {}, fast), args, None, (a, b), 5,
                           buffers=lambda device: (scratch[0],))
    assert bound is not None
    scratch[0] = torch.ones(8)  # another stream's buffer, say
    out = bound(a, b)
    assert calls[-1][9:12] == (a.data_ptr(), scratch[0].data_ptr(), out.data_ptr())
    assert bound_launcher(ki, KernelLaunch(None, (3, 2, 1), {}, fast), args, None, (a, b), 5) is None  # unknown tensor
