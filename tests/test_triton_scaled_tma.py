"""The persistent TMA fp8 template (`triton_scaled_tma`) on CPU: its config space and fitting, which
problems TMA can describe, the preview pool, and its numerics through Triton's interpreter (which runs
device-side tensor descriptors in numpy): every config and swizzle against the fp8 gate, with a
persistent grid smaller than the tile count so each program walks several tiles."""

import os

import pytest
import torch

pytest.importorskip("triton")

import gemmtune  # noqa: E402
from gemmtune.core.inputs import KernelInputs, TensorMeta  # noqa: E402
from gemmtune.measure.correctness import Reference, check, reference, verdict  # noqa: E402
from gemmtune.templates import default_templates  # noqa: E402
from gemmtune.templates.registry import active_templates  # noqa: E402
from gemmtune.templates.triton.base import DEFAULT_SMEM, SWIZZLES  # noqa: E402
from gemmtune.templates.triton.scaled_mm import TritonScaledMMTemplate  # noqa: E402
from gemmtune.templates.triton import base as triton_base  # noqa: E402
from gemmtune.templates.triton.scaled_tma import TritonScaledTMATemplate, config_space, descriptor_ready  # noqa: E402
from gemmtune.templates.triton.tma import fit_configs  # noqa: E402

from helpers import fp8_operands  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
needs_interp = pytest.mark.skipif(not INTERP, reason="numerics run through Triton's interpreter on CPU")
BF16, E5M2 = torch.bfloat16, torch.float8_e5m2
SMALL = [dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, num_stages=2, num_warps=4),
         dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_stages=2, num_warps=4)]


def run_all(tensors, out_dtype=BF16, fast=False, space=SMALL, num_sms=2):
    """Every config x swizzle on `tensors`, each output (NaN-poisoned first) checked against the reference."""
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=out_dtype, fast_accum=fast)
    template = TritonScaledTMATemplate(space=space, num_sms=num_sms)
    assert template.supports(ki), ki.describe()
    choices = template.configs(ki)
    assert {c.runtime_dict["swizzle"] for c in choices} == set(SWIZZLES)
    ref, exact = Reference.of(ki, tensors), reference(ki, tensors)
    launchers = {}
    for c in choices:
        launch = launchers.setdefault(c.binary_key, template.compile(c, ki, tensors))
        out = torch.full(ki.out_size, float("nan"), dtype=out_dtype)
        launch(tensors, out, **c.runtime_dict)
        assert verdict(ki, out, ref) is None and check(ki, out, exact) is None, (c.key, check(ki, out, exact))
    return ki, template, choices


@needs_interp
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast_accum"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_every_config_and_swizzle_passes_the_gate_over_a_persistent_grid(rowwise, with_bias, fast):
    tensors = fp8_operands(130, 96, 160, rowwise)  # 3 x 5 tiles of 64 x 32 on 2 programs; a partial row tile
    bias = ((torch.randn(160) * 4).to(BF16),) if with_bias else ()
    ki, template, choices = run_all(tensors + bias, fast=fast)
    assert template.sms(ki) == 2 < (130 // 64 + 1) * (160 // 32)


@needs_interp
def test_one_row_a_strided_bias_and_other_output_dtypes():
    a, b, sa, sb = fp8_operands(1, 64, 48, True)
    sb = sb * torch.logspace(-3, 3, 48, base=2.0)  # each column its own scale
    bias = (torch.randn(96) * 8).to(BF16)[::2]
    ki, _, _ = run_all((a, b, sa, sb, bias))
    assert ki.scales == "rowwise" and ki.bias.stride == (2,)
    for out_dtype in (torch.float32, torch.float16):
        run_all(fp8_operands(33, 64, 48, False, a_dtype=E5M2), out_dtype=out_dtype)


@needs_interp
def test_a_deep_k_step_promotes_at_most_every_128_elements_and_matches_torch():
    deep = [dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=256, num_stages=2, num_warps=4)]
    tensors = fp8_operands(16, 512, 32, False)
    ki, template, choices = run_all(tensors, out_dtype=torch.float32, space=deep)
    launch = template.compile(choices[0], ki, tensors)
    torch.testing.assert_close(launch(tensors), torch._scaled_mm(*tensors, out_dtype=torch.float32),
                               rtol=1e-4, atol=1e-4)


def test_the_space_fits_the_problem_and_shared_memory():
    space = config_space()
    assert space and all(c["BLOCK_M"] >= 64 and c["BLOCK_K"] >= 64 for c in space)
    small = fit_configs(space, 5, 48, 32, 1, DEFAULT_SMEM, out_bytes=2)
    assert {(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]) for c in small} == {(64, 64, 32)}
    assert all(c["num_warps"] == 4 for c in small)  # 8 warps want 128+ rows
    assert not fit_configs(space, 4096, 4096, 4096, 1, 40_000, out_bytes=4)  # nothing fits 40 kB
    big = fit_configs(space, 4096, 4096, 4096, 1, DEFAULT_SMEM, out_bytes=4)
    assert big and all("EPILOGUE_SUBTILE" not in c for c in big)  # the fp8 space stages whole tiles


def test_offered_where_tma_describes_the_operands_and_only_as_a_preview():
    a, b, sa, sb = fp8_operands(8, 64, 48, False)
    ki = KernelInputs.from_tensors("scaled_mm", a, b, sa, sb)
    assert descriptor_ready(ki)
    row_major_b = tuple(TensorMeta.of(t) for t in (a, b.contiguous(), sa, sb))  # torch refuses it; TMA here too
    assert not descriptor_ready(KernelInputs("scaled_mm", row_major_b, 1.0, 1.0, BF16, False))
    assert TritonScaledTMATemplate.src_hash != TritonScaledMMTemplate.src_hash
    assert TritonScaledTMATemplate.src_hash == triton_base.kernel_hash("scaled_tma_kernel.py")
    assert "triton_scaled_tma" not in [t.uid for t in default_templates()]
    pool = active_templates(ki, ("triton",), default_templates(preview=True))
    assert ("triton_scaled_tma" in [t.uid for t in pool]) == INTERP


@needs_interp
def test_a_preview_tune_runs_it_and_the_pick_is_right(monkeypatch):
    monkeypatch.setenv("GEMMTUNE_PREVIEW_TEMPLATES", "1")
    monkeypatch.setenv("GEMMTUNE_STORE", "memory")
    monkeypatch.setenv("GEMMTUNE_CONFIG_SPACE", "default")
    a, b, sa, sb = fp8_operands(20, 32, 32, True)
    sel = gemmtune.tune("scaled_mm", a, b, sa, sb, backends=("triton",))
    ran = {t.choice.template_uid for t in sel.timings if t.ms is not None}
    assert "triton_scaled_tma" in ran
    out = sel.kernel(a, b, sa, sb)
    torch.testing.assert_close(out, torch._scaled_mm(a, b, sa, sb, out_dtype=BF16), rtol=2e-2, atol=2e-2)
