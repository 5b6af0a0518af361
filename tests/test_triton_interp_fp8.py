"""The `triton_scaled_mm` template through Triton's interpreter (CPU): every config and swizzle passes
the fp8 correctness gate for tensor-wise and row-wise scales (one row included), with and without a
bias (a strided one included), for each output dtype torch allows and both `use_fast_accum` settings."""

import os

import pytest
import torch

pytest.importorskip("triton")
if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests run on machines without CUDA (tests/gpu covers CUDA)", allow_module_level=True)

from gemmtune.core.inputs import KernelInputs  # noqa: E402
from gemmtune.measure.correctness import Reference, check, reference, verdict  # noqa: E402
from gemmtune.search.base import ProblemDims  # noqa: E402
from gemmtune.search.model_pruned import ModelPrunedOptions, stage0  # noqa: E402
from gemmtune.templates import default_templates  # noqa: E402
from gemmtune.templates.registry import active_templates  # noqa: E402
from gemmtune.templates.triton import base as triton_base  # noqa: E402
from gemmtune.templates.triton.base import SWIZZLES  # noqa: E402
from gemmtune.templates.triton.scaled_mm import (NARROW_OUTPUT, TritonScaledMMTemplate, fit_configs,  # noqa: E402
                                                 narrow_space)

from helpers import fp8_operands  # noqa: E402

E4M3, E5M2, BF16 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
SMALL = [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, num_stages=2, num_warps=4),
         dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, num_stages=2, num_warps=4)]


quantised = fp8_operands  # (a, b, scale_a, scale_b) quantised as torchao does (tests/helpers.py)


def run_all(tensors, out_dtype=BF16, fast=False, space=SMALL):
    """Every config x swizzle of the template on `tensors`, each output checked against the reference."""
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=out_dtype, fast_accum=fast)
    template = TritonScaledMMTemplate(space=space)
    assert template.supports(ki), ki.describe()
    choices = template.configs(ki)
    assert {c.runtime_dict["swizzle"] for c in choices} == set(SWIZZLES)
    assert len({c.binary_key for c in choices}) == len(choices) // len(SWIZZLES)  # one binary, every swizzle
    ref, exact = Reference.of(ki, tensors), reference(ki, tensors)
    launchers = {}
    for c in choices:
        launch = launchers.setdefault(c.binary_key, template.compile(c, ki, tensors))
        out = torch.full(ki.out_size, float("nan"), dtype=out_dtype)  # poison: every element must be written
        launch(tensors, out, **c.runtime_dict)
        assert verdict(ki, out, ref) is None and check(ki, out, exact) is None, (c.key, check(ki, out, exact))
    return ki, template, choices


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast_accum"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_every_config_and_swizzle_passes_the_gate(rowwise, with_bias, fast):
    tensors = quantised(32, 64, 48, rowwise)
    bias = (torch.randn(48).to(BF16),) if with_bias else ()
    run_all(tensors + bias, fast=fast)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_other_output_dtypes_and_an_e5m2_a(out_dtype):
    ki, template, choices = run_all(quantised(32, 64, 48, False, a_dtype=E5M2), out_dtype=out_dtype)
    out = template.compile(choices[0], ki, quantised(32, 64, 48, False))(quantised(32, 64, 48, False))
    assert out.dtype == out_dtype and out.shape == (32, 48)  # the launcher's own output has the out_dtype


def test_edges_an_odd_m_and_a_k_not_a_multiple_of_block_k():
    tensors = quantised(37, 80, 48, True)  # 37 rows: a partial tile; K = 80: the last K step is masked
    ki, _, choices = run_all(tensors + (torch.randn(48).to(BF16),))
    assert any(ki.K % c.config_dict["BLOCK_K"] for c in choices)


def test_one_row_with_row_wise_scales_scales_each_column():
    a, b, sa, sb = quantised(1, 64, 48, True)  # scale_a [1, 1]: one element, yet a row-wise problem
    sb = sb * torch.logspace(-3, 3, 48, base=2.0)  # columns scaled 1/8 to 8 apart
    ki, _, _ = run_all((a, b, sa, sb))
    assert ki.scales == "rowwise"


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_a_strided_bias_is_read_with_its_stride(rowwise):
    bias = (torch.randn(96) * 8).to(BF16)[::2]  # every other element of a longer vector
    ki, _, _ = run_all(quantised(20, 64, 48, rowwise) + (bias,))
    assert ki.bias.stride == (2,)


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast_accum"])
def test_a_deep_k_step_promotes_its_partial_sums_at_most_every_128_elements(fast):
    """Without fast accumulation a K step of 256 is promoted to float32 every 128 elements (Triton's
    `max_num_imprecise_acc`; its sm_90 default is never, which read 1.6e-4 relative error on an H200)."""
    deep = [dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, num_stages=2, num_warps=4),
            dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, num_stages=2, num_warps=4)]
    ki, template, choices = run_all(quantised(16, 512, 32, False), out_dtype=torch.float32, fast=fast, space=deep)
    bound = {c.config_dict["BLOCK_K"]: template.launch_spec(c, ki)[0].meta["MAX_IMPRECISE"] for c in choices}
    assert bound == {256: 128, 64: 64}


def test_the_result_matches_torch_scaled_mm():
    tensors = quantised(32, 64, 48, True)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16)
    template = TritonScaledMMTemplate(space=SMALL)
    choice = template.configs(ki)[0]
    out = template.compile(choice, ki, tensors)(tensors, **choice.runtime_dict)
    want = torch._scaled_mm(*tensors, out_dtype=BF16)
    torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)


def test_src_hash_follows_the_kernel_source(tmp_path, monkeypatch):
    source = (triton_base.Path(triton_base.__file__).with_name("scaled_mm_kernel.py")).read_text()
    assert TritonScaledMMTemplate.src_hash == triton_base.kernel_hash("scaled_mm_kernel.py")
    assert TritonScaledMMTemplate.src_hash not in {t.src_hash for t in default_templates() if t.uid != "triton_scaled_mm"}
    copy = tmp_path / "scaled_mm_kernel.py"
    monkeypatch.setattr(triton_base, "Path", lambda p: tmp_path / "base.py" if p == triton_base.__file__
                        else triton_base.Path(p))
    copy.write_text(source)  # the same source elsewhere: the same hash
    assert triton_base.kernel_hash("scaled_mm_kernel.py") == TritonScaledMMTemplate.src_hash
    copy.write_text(source.replace("acc += tl.dot", "acc = acc + tl.dot"))  # one statement rewritten
    assert triton_base.kernel_hash("scaled_mm_kernel.py") != TritonScaledMMTemplate.src_hash


def test_offered_only_for_scaled_mm_and_not_pooled_on_cpu():
    tensors = quantised(32, 64, 48, False)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors)
    template = TritonScaledMMTemplate()
    mm = KernelInputs.from_tensors("mm", torch.randn(4, 4), torch.randn(4, 4))
    assert template.supports(ki) and not template.supports(mm)
    assert "triton_scaled_mm" in [t.uid for t in default_templates()]
    assert [t.uid for t in active_templates(ki, None)] == ["aten_scaled_mm"]  # CPU: the library kernel only
    assert all(c["BLOCK_K"] >= 32 for c in fit_configs(template.space, 32, 48, 16, triton_base.DEFAULT_SMEM))


def test_problems_of_at_most_sixteen_rows_also_get_the_skinny_one_and_two_warp_configs():
    """M <= 16 adds 16 x 16 and 16 x 32 tiles on one or two warps with a deep K step (Inductor keeps such a
    config on M = 16); the 1-warp ones pass the gate in the interpreter. A given space stays as given."""
    tensors = quantised(16, 512, 64, True)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16)
    template = TritonScaledMMTemplate()
    configs = template.compile_configs(ki)
    one_warp = [c for c in configs if c["num_warps"] == 1]
    assert {(c["BLOCK_N"], c["BLOCK_K"]) for c in one_warp} == {(16, 128), (16, 256), (32, 128), (32, 256)}
    taller = KernelInputs.from_tensors("scaled_mm", *quantised(17, 512, 64, True), out_dtype=BF16)
    assert not [c for c in template.compile_configs(taller) if c["num_warps"] == 1]
    assert TritonScaledMMTemplate(space=SMALL).compile_configs(ki) == fit_configs(SMALL, 16, 64, 512,
                                                                                  triton_base.DEFAULT_SMEM)
    ref, exact = Reference.of(ki, tensors), reference(ki, tensors)
    for c in [c for c in template.configs(ki) if c.config_dict["num_warps"] == 1 and c.runtime_dict["swizzle"] == 8]:
        out = torch.full(ki.out_size, float("nan"), dtype=BF16)
        template.compile(c, ki, tensors)(tensors, out, **c.runtime_dict)
        assert verdict(ki, out, ref) is None and check(ki, out, exact) is None, c.key


def shape_of(M, N, K):
    """The KernelInputs of a row-wise M x N x K scaled_mm (sizes only: the operands are left unset)."""
    a, b = torch.empty(M, K, dtype=E4M3), torch.empty(N, K, dtype=E4M3).t()
    return KernelInputs.from_tensors("scaled_mm", a, b, torch.ones(M, 1), torch.ones(1, N), out_dtype=BF16)


def test_small_outputs_of_more_than_sixteen_rows_also_get_the_narrow_configs():
    """Over 16 rows, an output of at most NARROW_OUTPUT elements adds the 32 x 16 and 64 x 16 tiles (on an
    H100, Inductor's 64 x 16 kernel beat the main space's best by 12 % at 128 x 1024 x 4096); a larger
    output or M <= 16 does not, and a given space stays as given. The narrow configs pass the gate in the
    interpreter."""
    template = TritonScaledMMTemplate()
    narrow = {(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["num_stages"], c["num_warps"]) for c in narrow_space()}

    def added(M, N, K):
        configs = template.compile_configs(shape_of(M, N, K))
        return {(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["num_stages"], c["num_warps"]) for c in configs
                if c["BLOCK_N"] == 16 and c["num_warps"] > 1}

    assert 128 * 1024 <= NARROW_OUTPUT < 128 * 4096
    assert added(128, 1024, 4096) == narrow
    assert added(128, 4096, 4096) == set() and added(1024, 1024, 4096) == set()
    assert {c[1] for c in added(16, 1024, 4096)} <= {16} and not added(16, 1024, 4096) & narrow
    assert TritonScaledMMTemplate(space=SMALL).compile_configs(shape_of(128, 1024, 4096)) == fit_configs(
        SMALL, 128, 1024, 4096, triton_base.DEFAULT_SMEM)
    # tune's default strategy keeps Inductor's 64 x 16 pick and the main space's best in its stage 0
    kv = stage0(template.configs(shape_of(128, 1024, 4096)),
                ModelPrunedOptions(stage0_n=20, problem=ProblemDims(128, 1024, 4096, dtype_bytes=1)))
    tiles = {(c.config_dict["BLOCK_M"], c.config_dict["BLOCK_N"], c.config_dict["BLOCK_K"],
              c.config_dict["num_stages"], c.config_dict["num_warps"]) for c in kv}
    assert {(64, 16, 256, 5, 4), (64, 32, 256, 4, 4)} <= tiles
    tensors = quantised(40, 256, 48, True)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16)
    configs = [c for c in template.configs(ki) if c.config_dict["BLOCK_N"] == 16 and c.runtime_dict["swizzle"] == 8]
    firsts = {c.config_dict["BLOCK_M"]: c for c in reversed(configs)}  # one config per tile height
    assert sorted(firsts) == [32, 64]
    ref, exact = Reference.of(ki, tensors), reference(ki, tensors)
    for c in firsts.values():
        out = torch.full(ki.out_size, float("nan"), dtype=BF16)
        template.compile(c, ki, tensors)(tensors, out, **c.runtime_dict)
        assert verdict(ki, out, ref) is None and check(ki, out, exact) is None, c.key
