"""The persistent TMA template on CPU: config space, TMA compatibility rules, supports() with a
mocked Hopper device, the allocator, and numerics through Triton's interpreter (which runs
device-side tensor descriptors in numpy, with TMA's alignment checks)."""

import contextvars
import os

import pytest
import torch

import gemmtune.templates.triton.base as triton_base
import gemmtune.templates.triton.tma as tma
from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.templates.triton.tma import (TritonTMAPersistentTemplate, b_trans, config_space, fit_configs,
                                           tma_compatible, tma_store)

INTERP = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
needs_interp = pytest.mark.skipif(not INTERP, reason="numerics run through Triton's interpreter on CPU")
pytest.importorskip("triton")
SMALL = [dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, num_stages=3, num_warps=4, EPILOGUE_SUBTILE=0),
         dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_stages=3, num_warps=4, EPILOGUE_SUBTILE=1)]
F16 = torch.float16


def ki_of(op, *tensors, **kw):
    return KernelInputs.from_tensors(op, *tensors, **kw)


def operands(op, M, K, N, dtype, b_layout):
    a = torch.randn(M, K, dtype=dtype)
    b = torch.randn(N, K, dtype=dtype).t() if b_layout == "col" else torch.randn(K, N, dtype=dtype)
    return (torch.randn(N, dtype=dtype), a, b) if op == "addmm" else (a, b)


def on_cuda(ki):
    """The same problem described as living on cuda:0 (no GPU needed to describe it)."""
    return KernelInputs(ki.op, tuple(TensorMeta(o.size, o.stride, o.dtype, "cuda:0") for o in ki.operands),
                        ki.alpha, ki.beta)


# -- space, layout rules, supports ------------------------------------------------------------------

def test_space_sizes():
    assert 20 <= len(config_space()) < 100 <= len(config_space("max"))
    assert all(c["EPILOGUE_SUBTILE"] in (0, 1) for c in config_space("max"))
    with pytest.raises(ValueError):
        config_space("tiny")


def test_fit_respects_shared_memory_and_wgmma_minimum():
    big = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8, EPILOGUE_SUBTILE=0)
    # 4 x 384 x 64 x 2 + 128 x 256 x 2 = 262144 bytes > 232448 ...
    assert fit_configs([big], 4096, 4096, 4096, 2, 232448) == []
    # ... the half-width epilogue buffer fits: 196608 + 32768.
    assert fit_configs([dict(big, EPILOGUE_SUBTILE=1)], 4096, 4096, 4096, 2, 232448)
    small = fit_configs([big], 1, 16, 40, 2, 232448)
    assert small == [dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=64, num_stages=4, num_warps=4, EPILOGUE_SUBTILE=0)]


def test_a_store_through_pointers_budgets_a_whole_tile_for_its_epilogue():
    # On an H100 this config failed to compile for an odd-N head: 262176 bytes of shared memory needed.
    cfg = dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_stages=4, num_warps=8, EPILOGUE_SUBTILE=1)
    assert fit_configs([cfg], 8192, 50257, 768, 2, 232448) and not fit_configs([cfg], 8192, 50257, 768, 2, 232448,
                                                                              tma_out=False)


def test_tma_compatible_layouts():
    a = torch.ones(5, 64, dtype=F16)
    assert tma_compatible(ki_of("mm", a, torch.ones(64, 24, dtype=F16)))
    assert tma_compatible(ki_of("mm", a, torch.ones(24, 64, dtype=F16).t()))
    assert b_trans(ki_of("mm", a, torch.ones(24, 64, dtype=F16).t())) is True
    assert b_trans(ki_of("mm", a, torch.ones(64, 24, dtype=F16))) is False
    assert not tma_compatible(ki_of("mm", torch.ones(5, 60, dtype=F16), torch.ones(60, 24, dtype=F16)))  # K*2 % 16
    assert not tma_compatible(ki_of("mm", a, torch.ones(64, 20, dtype=F16)))  # B's rows: N*2 % 16
    odd_head = ki_of("mm", a, torch.ones(21, 64, dtype=F16).t())  # only the output's rows: stored by pointers
    assert tma_compatible(odd_head) and not tma_store(odd_head)
    assert not tma_compatible(ki_of("mm", torch.ones(64, 8, dtype=F16).t(), torch.ones(64, 24, dtype=F16)))  # A^T
    strided = torch.ones(64, 48, dtype=F16)[:, ::2]  # inner stride 2
    assert not tma_compatible(ki_of("mm", a, strided))
    padded = torch.ones(64, 40, dtype=F16)[:, :24]  # row stride 40 elements = 80 bytes: fine
    assert tma_compatible(ki_of("mm", a, padded))
    assert tma_compatible(ki_of("mm", torch.ones(5, 16), torch.ones(16, 4)))  # fp32: 16 bytes


def test_supports_needs_hopper_fp16_bf16_and_mm(monkeypatch):
    t = TritonTMAPersistentTemplate()
    ki = on_cuda(ki_of("mm", torch.ones(8, 64, dtype=F16), torch.ones(64, 32, dtype=F16)))
    monkeypatch.setattr(tma, "capability", lambda device: (9, 0))
    assert t.supports(ki) == tma.tensor_descriptors_available()
    monkeypatch.setattr(tma, "capability", lambda device: (8, 0))
    assert not t.supports(ki)
    monkeypatch.setattr(tma, "capability", lambda device: (10, 0))
    f32 = on_cuda(ki_of("mm", torch.ones(8, 64), torch.ones(64, 32)))
    assert not t.supports(f32) and TritonTMAPersistentTemplate(allow_fp32=True).supports(f32)
    bmm = on_cuda(ki_of("bmm", torch.ones(2, 8, 64, dtype=F16), torch.ones(2, 64, 32, dtype=F16)))
    assert not t.supports(bmm)
    odd = on_cuda(ki_of("mm", torch.ones(8, 63, dtype=F16), torch.ones(63, 32, dtype=F16)))
    assert not t.supports(odd)


def test_cpu_only_through_the_interpreter(monkeypatch):
    t = TritonTMAPersistentTemplate()
    ki = ki_of("mm", torch.ones(8, 64, dtype=F16), torch.ones(64, 32, dtype=F16))
    monkeypatch.setattr(triton_base, "interpreting", lambda: False)
    assert not t.supports(ki)
    monkeypatch.setattr(triton_base, "interpreting", lambda: True)
    assert t.supports(ki) == tma.tensor_descriptors_available()


def test_allocator_is_installed_once_per_context():
    from triton.runtime import _allocation

    def run():
        assert isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
        tma.ensure_allocator()
        assert _allocation._allocator.get() is tma._scratch
        mine = lambda size, alignment, stream: None  # noqa: E731
        _allocation._allocator.set(mine)
        tma.ensure_allocator()  # a user's allocator stays
        assert _allocation._allocator.get() is mine

    contextvars.Context().run(run)  # a fresh context, like a new thread's


# -- numerics through the interpreter ---------------------------------------------------------------

def run_all(op, tensors, alpha=1.0, beta=1.0, template=None):
    from gemmtune.measure.correctness import check, reference

    ki = ki_of(op, *tensors, alpha=alpha, beta=beta)
    template = template or TritonTMAPersistentTemplate(space=SMALL, num_sms=3, allow_fp32=True)
    assert template.supports(ki)
    choices = template.configs(ki)
    assert choices and {c.runtime_dict["swizzle"] for c in choices} == {1, 2, 4, 8}
    ref = reference(ki, tensors)
    launchers = {}
    for c in choices:
        launch = launchers.setdefault(c.binary_key, template.compile(c, ki, tensors))
        out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype)  # poison: every element must be written
        launch(tensors, out, **c.runtime_dict)
        assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))
    return ki, choices


@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(137, 72, 88), (1, 40, 64), (65, 8, 200)])
def test_mm_odd_shapes(dtype, b_layout, shape):
    run_all("mm", operands("mm", *shape, dtype, b_layout))


@needs_interp
@pytest.mark.parametrize("op", ["mm", "addmm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(137, 72, 21), (1, 40, 35)])
def test_an_output_whose_rows_tma_cannot_store_is_written_through_pointers(op, dtype, shape):
    tensors = operands(op, *shape, dtype, "col")  # B = W.t(): A and W load through TMA, the output's N is odd
    ki = ki_of(op, *tensors)
    assert not tma_store(ki)
    run_all(op, tensors, alpha=0.5 if op == "addmm" else 1.0, beta=-2.0 if op == "addmm" else 1.0)


@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_addmm_alpha_beta_bias(dtype):
    run_all("addmm", operands("addmm", 70, 48, 40, dtype, "col"), alpha=0.5, beta=-2.0)


@needs_interp
def test_addmm_2d_bias_and_beta_zero_ignores_nan_bias():
    bias, a, b = operands("addmm", 70, 32, 48, F16, "row")
    run_all("addmm", (torch.randn(70, 48, dtype=F16), a, b), alpha=2.0, beta=0.5)
    run_all("addmm", (torch.full_like(bias, float("nan")), a, b), beta=0.0)


@needs_interp
def test_persistent_loop_covers_every_tile_for_any_program_count():
    a, b = operands("mm", 200, 32, 96, F16, "row")  # 4 x 3 = 12 tiles of 64 x 32
    for sms in (1, 5, 12, 40):
        run_all("mm", (a, b), template=TritonTMAPersistentTemplate(space=SMALL[:1], num_sms=sms))


@needs_interp
def test_misaligned_operand_and_strided_output_are_refused():
    storage = torch.randn(1 + 40 * 64, dtype=F16)
    a = storage[1:].view(40, 64)  # data_ptr 2 bytes past an aligned one
    b = torch.randn(64, 32, dtype=F16)
    ki = ki_of("mm", a, b)
    t = TritonTMAPersistentTemplate(space=SMALL[:1], num_sms=2)
    launch = t.compile(t.configs(ki)[0], ki, (a, b))
    with pytest.raises(ValueError, match="16-byte aligned"):
        launch((a, b))
    aligned = a.clone()
    with pytest.raises(ValueError, match="row-major"):
        launch((aligned, b), torch.empty(32, 40, dtype=F16).t())


@needs_interp
def test_an_output_off_a_16_byte_boundary_is_computed_aside_and_copied_in():
    tensors = operands("mm", 16, 32, 24, F16, "col")  # rows of 48 bytes: stored through a descriptor
    ki = ki_of("mm", *tensors)
    assert tma_store(ki)
    t = TritonTMAPersistentTemplate(space=SMALL[:1], num_sms=2)
    launch = t.compile(t.configs(ki)[0], ki, tensors)
    storage = torch.full((16 * 24 + 1,), float("nan"), dtype=F16)
    out = storage[1:].view(16, 24)  # 2 bytes past an aligned base: no descriptor may store it
    assert launch(tensors, out) is out
    torch.testing.assert_close(out.float(), tensors[0].float() @ tensors[1].float(), rtol=5e-3, atol=5e-2)


@needs_interp
def test_tune_end_to_end_through_the_interpreter():
    import gemmtune
    from gemmtune.templates.extern import AtenTemplate

    a, b = operands("mm", 70, 48, 40, torch.float16, "col")
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), TritonTMAPersistentTemplate(space=SMALL, num_sms=2)],
                        backends=("extern", "triton"), strategy="exhaustive", settings=gemmtune.Settings(store="off"))
    templated = [t for t in sel.timings if not t.choice.is_extern]
    assert templated and all(t.status == "ok" for t in templated)
    torch.testing.assert_close(sel(a, b).float(), (a.float() @ b.float()), rtol=5e-3, atol=5e-2)
