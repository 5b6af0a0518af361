"""The split-K template: rule, config space and (through Triton's interpreter) numerics."""

import os

import pytest
import torch

from gemmtune.core.inputs import KernelInputs
from gemmtune.templates import active_templates, default_templates
from gemmtune.templates.triton.splitk import (SPLITS, TritonSplitKTemplate, config_space, fit_configs,
                                              splitk_worthwhile)

INTERP = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
needs_interp = pytest.mark.skipif(not INTERP, reason="numerics run through Triton's interpreter on CPU")
SMALL = [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT_K=s, num_stages=2, num_warps=4) for s in (2, 3, 4, 8)]


def operands(op, M, K, N, dtype, b_layout, batch=1):
    lead = (batch,) if op == "bmm" else ()
    a = torch.randn(*lead, M, K, dtype=dtype)
    b = torch.randn(*lead, N, K, dtype=dtype).transpose(-1, -2) if b_layout == "col" else torch.randn(*lead, K, N, dtype=dtype)
    return (torch.randn(N, dtype=dtype), a, b) if op == "addmm" else (a, b)


class Unfitted(TritonSplitKTemplate):
    """Every config of `space` as is: splits may exceed the K steps (empty slices)."""

    def compile_configs(self, ki):
        return [dict(c) for c in self.space]


class PoisonedWorkspace(Unfitted):
    def workspace(self, shape, device):
        return torch.full(shape, float("nan"), dtype=torch.float32, device=device)


def run_all(op, tensors, alpha=1.0, beta=1.0, template=None):
    from gemmtune.measure.correctness import check, reference

    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    template = template or TritonSplitKTemplate(space=SMALL, force=True)
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


# -- rule and space (no interpreter needed) ------------------------------------------------------------

def test_rule_offers_long_k_small_outputs_only():
    assert splitk_worthwhile(16, 4096, 14336) and splitk_worthwhile(256, 256, 65536) and splitk_worthwhile(1, 6144, 4096)
    assert not splitk_worthwhile(4096, 4096, 4096) and not splitk_worthwhile(128, 28672, 4096)
    assert splitk_worthwhile(64, 64, 1024) and not splitk_worthwhile(64, 64, 512)  # K too short to split
    assert not splitk_worthwhile(256, 256, 4096, batch=128)  # batch fills the GPU


def test_space_sizes_and_splits():
    default, big = config_space(), config_space("max")
    assert len(default) <= 48 and len(big) >= 100
    assert {c["SPLIT_K"] for c in default} == set(SPLITS)
    with pytest.raises(ValueError, match="unknown size"):
        config_space("huge")


def test_fit_drops_empty_slices_and_big_workspaces(monkeypatch):
    cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, SPLIT_K=16, num_stages=3, num_warps=4)
    assert fit_configs([cfg], 16, 4096, 16 * 128, 2, 232448)
    assert not fit_configs([cfg], 16, 4096, 15 * 128, 2, 232448)
    import gemmtune.templates.triton.splitk as mod

    monkeypatch.setattr(mod, "WORKSPACE_LIMIT", 16 * 16 * 4096 * 4 - 1)
    assert not fit_configs([cfg], 16, 4096, 16 * 128, 2, 232448)


def test_supports_follows_rule_unless_forced():
    a, b = torch.ones(8, 64), torch.ones(64, 8)
    ki = KernelInputs.from_tensors("mm", a, b)  # K = 64: not worthwhile
    assert not TritonSplitKTemplate().offered(ki)
    assert TritonSplitKTemplate(force=True).offered(ki)
    assert TritonSplitKTemplate(offer=lambda k: k.M == 8).offered(ki)
    f64 = KernelInputs.from_tensors("mm", a.double(), b.double())
    assert not TritonSplitKTemplate(force=True).supports(f64)


def test_registered_after_plain_by_default_and_not_native_on_cpu():
    assert "triton_splitk" not in [t.uid for t in default_templates(hopper=False)]
    uids = [t.uid for t in default_templates()]
    assert uids.index("triton_mm") < uids.index("triton_splitk") < uids.index("triton_tma_persistent")
    ki = KernelInputs.from_tensors("mm", torch.ones(16, 4096), torch.ones(4096, 64))  # split-K worthy
    active = {t.uid for t in active_templates(ki, None, hopper=True)}
    assert "triton_splitk" not in active and "triton_tma_persistent" not in active


# -- numerics through the interpreter ------------------------------------------------------------------

@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(37, 145, 29), (1, 200, 33), (50, 130, 1)])
def test_mm_odd_shapes_every_split_and_swizzle(dtype, b_layout, shape):
    M, K, N = shape
    ki, choices = run_all("mm", operands("mm", M, K, N, dtype, b_layout))
    assert {c.config_dict["SPLIT_K"] for c in choices} == {2, 3, 4, 8}


@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_addmm_alpha_beta_bias(dtype):
    run_all("addmm", operands("addmm", 33, 120, 21, dtype, "col"), alpha=0.5, beta=-2.0)


@needs_interp
def test_addmm_2d_bias_and_beta_zero_ignores_nan_bias():
    bias, a, b = operands("addmm", 19, 80, 18, torch.float32, "row")
    run_all("addmm", (torch.randn(19, 18), a, b), alpha=2.0, beta=0.5)
    run_all("addmm", (torch.full_like(bias, float("nan")), a, b), beta=0.0)


@needs_interp
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_bmm(b_layout):
    run_all("bmm", operands("bmm", 17, 70, 20, torch.float16, b_layout, batch=3))


@needs_interp
def test_more_splits_than_k_steps_and_poisoned_workspace():
    # K = 40 with BLOCK_K = 16: 3 K steps, so SPLIT_K = 8 leaves 5 slices empty; the NaN workspace
    # proves every slice (empty ones included) writes its whole partial tile.
    space = [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT_K=8, num_stages=2, num_warps=4)]
    run_all("mm", operands("mm", 20, 40, 24, torch.float32, "row"), template=PoisonedWorkspace(space=space, force=True))


@needs_interp
def test_deterministic():
    a, b = operands("mm", 30, 160, 20, torch.float32, "row")
    ki = KernelInputs.from_tensors("mm", a, b)
    t = TritonSplitKTemplate(space=SMALL[1:2], force=True)
    c = t.configs(ki)[0]
    launch = t.compile(c, ki, (a, b))
    first, second = launch((a, b)), launch((a, b))
    assert torch.equal(first, second)


@needs_interp
def test_tune_end_to_end_through_the_interpreter():
    import gemmtune
    from gemmtune.templates.extern import AtenTemplate

    a, b = operands("mm", 24, 96, 20, torch.float32, "col")
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), TritonSplitKTemplate(space=SMALL[:2], force=True)],
                        backends=("extern", "triton"), strategy="exhaustive", settings=gemmtune.Settings(store="off"))
    templated = [t for t in sel.timings if not t.choice.is_extern]
    assert templated and all(t.status == "ok" for t in templated)
    assert {t.choice.template_uid for t in templated} == {"triton_splitk"}
    torch.testing.assert_close(sel(a, b), a @ b, rtol=1e-4, atol=1e-4)
