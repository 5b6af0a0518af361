"""The GEMV template: offer rule, config space, registration and, through Triton's
interpreter, numerics for mm / addmm / bmm with M <= 4."""

import os

import pytest
import torch

import gemmtune
from gemmtune.measure.correctness import check, reference
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates import active_templates, default_templates
from gemmtune.templates.extern import AtenTemplate
from gemmtune.templates.triton.gemv import GEMV_MAX_M, TritonGemvTemplate, config_space, fit_configs

INTERP = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
needs_interp = pytest.mark.skipif(not INTERP, reason="numerics run through Triton's interpreter on CPU")
SMALL = [dict(BLOCK_N=1, BLOCK_K=64, num_warps=4), dict(BLOCK_N=4, BLOCK_K=16, num_warps=4), dict(BLOCK_N=16, BLOCK_K=32, num_warps=4),
         dict(BLOCK_N=64, BLOCK_K=16, num_warps=8)]


def operands(op, M, K, N, dtype, b_layout, batch=1):
    lead = (batch,) if op == "bmm" else ()
    a = torch.randn(*lead, M, K, dtype=dtype)
    if b_layout == "col":
        b = torch.randn(*lead, N, K, dtype=dtype).transpose(-1, -2)
    elif b_layout == "sliced":
        b = torch.randn(*lead, K, 2 * N + 1, dtype=dtype)[..., 1::2][..., :N]
    else:
        b = torch.randn(*lead, K, N, dtype=dtype)
    return (torch.randn(N, dtype=dtype), a, b) if op == "addmm" else (a, b)


def run_all(op, tensors, alpha=1.0, beta=1.0, space=SMALL):
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    template = TritonGemvTemplate(space=space)
    assert template.supports(ki)
    choices = template.configs(ki)
    assert choices and all(c.runtime == () for c in choices)  # no runtime tuning parameter
    ref = reference(ki, tensors)
    for c in choices:
        out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype)  # poison: every element must be written
        template.compile(c, ki, tensors)(tensors, out)
        assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))
    return ki, choices


# -- rule, space, registration (no interpreter needed) -------------------------------------------------

def test_offered_for_at_most_four_rows_and_float_types():
    t = TritonGemvTemplate()
    for m in range(1, GEMV_MAX_M + 1):
        assert t.offered(KernelInputs.from_tensors("mm", torch.ones(m, 32), torch.ones(32, 8)))
    assert not t.offered(KernelInputs.from_tensors("mm", torch.ones(5, 32), torch.ones(32, 8)))
    assert not t.supports(KernelInputs.from_tensors("mm", torch.ones(1, 32).double(), torch.ones(32, 8).double()))


def test_space_sizes_and_fit():
    assert len(config_space()) == 30 and len(config_space("max")) >= 100
    assert len({tuple(sorted(c.items())) for c in config_space()}) == 30  # no duplicates
    with pytest.raises(ValueError, match="unknown size"):
        config_space("huge")
    fitted = fit_configs(config_space(), N=6, K=40)
    assert fitted and all(c["BLOCK_N"] <= 8 and c["BLOCK_K"] <= 64 for c in fitted)
    assert len({tuple(sorted(c.items())) for c in fitted}) == len(fitted)


def test_in_the_default_pool_and_previews_extend_it(monkeypatch):
    from gemmtune.templates import registry

    assert "triton_gemv" in [t.uid for t in default_templates()]
    assert "triton_gemv" not in [t.uid for t in default_templates(hopper=False)]
    assert not gemmtune.Settings().preview_templates
    assert gemmtune.Settings.from_env({"GEMMTUNE_PREVIEW_TEMPLATES": "1"}).preview_templates
    previews = [t.uid for t in default_templates(preview=True)]
    assert [u for u in previews if u != "triton_scaled_tma"] == [t.uid for t in default_templates()]
    assert "triton_scaled_tma" in previews and "triton_scaled_tma" not in [t.uid for t in default_templates()]
    monkeypatch.setattr(registry, "PREVIEW_TEMPLATES", (TritonGemvTemplate,))
    assert [t.uid for t in default_templates(hopper=False, preview=True)].count("triton_gemv") == 1
    ki = KernelInputs.from_tensors("mm", torch.ones(1, 64), torch.ones(64, 64))
    assert "triton_gemv" not in {t.uid for t in active_templates(ki, None)}  # not native on CPU


def test_source_hash_is_the_kernel_file_and_the_shared_device_functions():
    import hashlib

    from gemmtune.templates.triton import base

    files = (base.Path(base.__file__).with_name("gemv_kernel.py"), base.COMMON_KERNEL_FILE)
    assert TritonGemvTemplate.src_hash == hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


# -- numerics through the interpreter ------------------------------------------------------------------

@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("b_layout", ["row", "col", "sliced"])
@pytest.mark.parametrize("shape", [(1, 100, 37), (3, 33, 70), (4, 16, 1), (2, 1, 9)])
def test_mm_odd_shapes_and_layouts(dtype, b_layout, shape):
    run_all("mm", operands("mm", *shape, dtype, b_layout))


@needs_interp
@pytest.mark.parametrize("bias_shape", [(21,), (1, 21), (2, 21), (2, 1)])
def test_addmm_every_bias_form_alpha_beta(bias_shape):
    _, a, b = operands("addmm", 2, 50, 21, torch.float32, "col")
    run_all("addmm", (torch.randn(bias_shape), a, b), alpha=0.5, beta=-1.5)


@needs_interp
def test_addmm_beta_zero_ignores_nan_bias_and_nan_inf_in_data_propagate():
    _, a, b = operands("addmm", 1, 40, 12, torch.float32, "row")
    run_all("addmm", (torch.full((12,), float("nan")), a, b), beta=0.0)
    a = a.clone()
    a[0, 3] = float("inf")
    run_all("mm", (a, b))  # inf times a random column: +-inf (or NaN) exactly where the reference has it


@needs_interp
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_bmm(b_layout):
    run_all("bmm", operands("bmm", 3, 45, 20, torch.float16, b_layout, batch=3))


@needs_interp
def test_tune_end_to_end_through_the_interpreter():
    a, b = operands("mm", 1, 96, 40, torch.float32, "col")
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), TritonGemvTemplate(space=SMALL)],
                        backends=("extern", "triton"), strategy="exhaustive", settings=gemmtune.Settings(store="off"))
    templated = [t for t in sel.timings if not t.choice.is_extern]
    assert len(templated) == len(SMALL) and all(t.status == "ok" for t in templated)
    torch.testing.assert_close(sel(a, b), a @ b, rtol=1e-4, atol=1e-4)


@needs_interp
def test_addmm_alpha_zero_drops_nan_and_inf_of_the_operands():
    bias, a, b = operands("addmm", 3, 40, 12, torch.float32, "row")
    a[1, 4], b[5, 6] = float("nan"), float("-inf")  # torch.addmm(alpha=0) does not compute A @ B
    ki, choices = run_all("addmm", (bias, a, b), alpha=0.0, beta=2.0)
    out = TritonGemvTemplate(space=SMALL).compile(choices[0], ki, (bias, a, b))((bias, a, b))
    torch.testing.assert_close(out, torch.addmm(bias, a, b, alpha=0.0, beta=2.0))
