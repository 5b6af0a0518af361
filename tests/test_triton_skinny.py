"""The one-launch split-K template `triton_skinny`: offer rule, config space, registration, the
direct launch path's specialisation guard, and (through Triton's interpreter) numerics for mm /
addmm / bmm with every split, the counters reset after each launch and bitwise-stable results."""

import os

import pytest
import torch

from gemmtune.measure.correctness import check, reference
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates import active_templates, default_templates
from gemmtune.templates.triton.launch import FastLaunch
from gemmtune.templates.triton.skinny import (SKINNY_MAX_M, WORKSPACE_LIMIT, TritonSkinnyTemplate, config_space,
                                              fit_configs)

INTERP = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
needs_interp = pytest.mark.skipif(not INTERP, reason="numerics run through Triton's interpreter on CPU")
SMALL = [dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, SPLIT_K=s, num_stages=2, num_warps=4) for s in (1, 2, 3, 5)]


def operands(op, M, K, N, dtype, b_layout, batch=1):
    lead = (batch,) if op == "bmm" else ()
    a = torch.randn(*lead, M, K, dtype=dtype)
    b = (torch.randn(*lead, N, K, dtype=dtype).transpose(-1, -2) if b_layout == "col"
         else torch.randn(*lead, K, N, dtype=dtype))
    return (torch.randn(N, dtype=dtype), a, b) if op == "addmm" else (a, b)


def run_all(op, tensors, alpha=1.0, beta=1.0, space=SMALL, swizzles=(1, 8)):
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    template = TritonSkinnyTemplate(space=space)
    assert template.supports(ki)
    ref = reference(ki, tensors)
    splits = set()
    for c in template.configs(ki):
        if c.runtime_dict["swizzle"] not in swizzles:
            continue
        launch = template.compile(c, ki, tensors)
        first = None
        for _ in range(2):  # the second launch needs the counters back at 0
            out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype)
            launch(tensors, out, **c.runtime_dict)
            assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))
            if first is None:
                first = out.clone()
            else:
                assert torch.equal(out, first), c.key  # partials summed in slice order: bitwise stable
        splits.add(c.config_dict["SPLIT_K"])
    return splits


def test_offer_rule_and_registration():
    skinny = KernelInputs.from_tensors("mm", torch.ones(SKINNY_MAX_M, 64), torch.ones(64, 8))
    wide = KernelInputs.from_tensors("mm", torch.ones(SKINNY_MAX_M + 1, 64), torch.ones(64, 8))
    t = TritonSkinnyTemplate()
    assert t.offered(skinny) and not t.offered(wide)
    assert "triton_skinny" in [x.uid for x in default_templates()]
    assert "triton_skinny" not in [x.uid for x in default_templates(hopper=False)]
    # On a CPU without the interpreter there is no Triton device: not active.
    if not INTERP:
        assert "triton_skinny" not in [x.uid for x in active_templates(skinny, None)]


def test_config_spaces():
    default, big = config_space(), config_space("max")
    assert len(default) <= 64 < 100 <= len(big)
    assert {c["SPLIT_K"] for c in default} == {1, 2, 4, 8} and 16 in {c["SPLIT_K"] for c in big}
    with pytest.raises(ValueError, match="unknown size"):
        config_space("huge")


def test_fit_clamps_and_drops():
    cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, SPLIT_K=8, num_stages=3, num_warps=8)
    fitted = fit_configs([cfg], 1, 4096, 4096, 2, 232_448)
    assert fitted and fitted[0]["BLOCK_M"] == 16  # M = 1 needs no more than the 16-row minimum
    assert fit_configs([cfg], 1, 4096, 512, 2, 232_448) == []  # 4 K steps cannot feed 8 slices
    assert fit_configs([dict(cfg, num_stages=6)], 128, 4096, 4096, 2, 232_448) == []  # over shared memory
    huge_n = WORKSPACE_LIMIT // (16 * 4)  # 8 slices of [16, huge_n] fp32 partials exceed the limit
    assert fit_configs([dict(cfg, BLOCK_N=64, BLOCK_K=64, num_stages=3)], 1, huge_n, 4096, 2, 232_448) == []


def test_fast_launch_guard_needs_same_specialisation():
    from types import SimpleNamespace as P

    # A kernel (A, B, N, GROUP, BLOCK: constexpr) with GROUP excluded from specialisation.
    kernel = P(params=[P(name="A", is_constexpr=False, do_not_specialize=False),
                       P(name="B", is_constexpr=False, do_not_specialize=False),
                       P(name="N", is_constexpr=False, do_not_specialize=False),
                       P(name="GROUP", is_constexpr=False, do_not_specialize=True),
                       P(name="BLOCK", is_constexpr=True, do_not_specialize=False)])
    compiled = P(function=object(), packed_metadata=object(), run=None)
    a, b = torch.ones(64), torch.ones(64)
    args = (a, b, 64, 8)
    fast = FastLaunch.build(kernel, compiled, (1, 2), dict(BLOCK=32, num_warps=4), args, device=0)
    assert fast is not None and fast.matches(args)
    assert fast.matches((a, b, 64, 1))  # the swizzle is not specialised on
    assert not fast.matches((a, b, 65, 8))  # another N
    assert not fast.matches((torch.ones(65)[1:], b, 64, 8))  # a misaligned operand
    assert FastLaunch.build(kernel, compiled, (1, 2), {"num_warps": 4}, args, device=0) is None  # BLOCK unknown
    assert FastLaunch.build(kernel, compiled, (1, 2), dict(BLOCK=32), args[:-1], device=0) is None
    assert FastLaunch.build(None, compiled, (1, 2), dict(BLOCK=32), args, device=0) is None


@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(1, 200, 40), (5, 160, 17), (17, 300, 70)])
def test_mm_every_split(dtype, b_layout, shape):
    assert run_all("mm", operands("mm", *shape, dtype, b_layout)) == {1, 2, 3, 5}


@needs_interp
def test_addmm_and_bmm():
    assert run_all("addmm", operands("addmm", 3, 160, 40, torch.float32, "col"), alpha=0.5, beta=1.5)
    assert run_all("bmm", operands("bmm", 2, 96, 33, torch.float32, "row", batch=3))


@needs_interp
def test_nan_propagates_and_beta_zero_ignores_bias():
    bias, a, b = operands("addmm", 2, 128, 32, torch.float32, "row")
    a = a.clone()
    a[0, 5] = float("nan")
    bias = torch.full_like(bias, float("nan"))
    ki = KernelInputs.from_tensors("addmm", bias, a, b, alpha=1.0, beta=0.0)
    t = TritonSkinnyTemplate(space=SMALL[1:2])
    c = t.configs(ki)[0]
    out = t.compile(c, ki, (bias, a, b))((bias, a, b), **c.runtime_dict)
    assert torch.isnan(out[0]).all() and not torch.isnan(out[1]).any()
