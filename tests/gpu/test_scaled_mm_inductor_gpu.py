"""gemmtune's installed handler answering `torch._scaled_mm` under `torch.compile` on a GPU
(`gemmtune.inductor.scaled`): a small fp8 Linear-like function compiled with `install()`, its output
against `torch._scaled_mm`, and what the handler built (the cuBLASLt extern or Inductor's own mm
template with a `triton_scaled_mm` config).  Skipped without CUDA or without fp8 tensor cores
(compute capability < 8.9).

    python -m pytest -q tests/gpu/test_scaled_mm_inductor_gpu.py
"""

from __future__ import annotations

import re

import pytest
import torch

import gemmtune.inductor as gi
from gemmtune.core.choices import Choice, as_params
from gemmtune.core.inputs import KernelInputs
from gemmtune.inductor import scaled
from gemmtune.inductor.entries import TILE_KEYS, entry_options

FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
pytestmark = [pytest.mark.skipif(not FP8, reason="needs CUDA with fp8 tensor cores (capability >= 8.9)"),
              pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table")]

E4M3, BF16 = torch.float8_e4m3fn, torch.bfloat16
M, K, N = 128, 1024, 512
TILE = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, num_stages=3, num_warps=4)
MODES = ["default", "max-autotune-no-cudagraphs"]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    from torch._inductor import config

    monkeypatch.setenv("GEMMTUNE_STORE", str(tmp_path / "store.sqlite"))
    torch._dynamo.reset()
    with config.patch(fx_graph_cache=False, autotune_local_cache=False):
        yield
    from gemmtune.inductor import installer

    while installer._PRIOR:
        gi.uninstall()
    torch._dynamo.reset()


def quantised(rowwise: bool, bias: bool = True) -> tuple:
    """(a, b, scale_a, scale_b[, bias]) on the GPU, quantised as torchao does (scale = amax / 448), B = w.t()."""
    from gemmtune.offline.fp8_spec import quantise

    a, sa = quantise(torch.randn(M, K, device="cuda"), E4M3, rowwise)
    w, sw = quantise(torch.randn(N, K, device="cuda"), E4M3, rowwise)
    out = (a, w.t(), sa, sw.t().contiguous() if rowwise else sw)
    return out + ((torch.randn(N, device="cuda").to(BF16),) if bias else ())


def scaled_relu(a, b, sa, sb, bias=None, fast=False):
    return torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=BF16, use_fast_accum=fast).relu()


def fp8_linear(x, wq, w_scale, bias):
    """A Linear-like fp8 layer: its bf16 activation quantised row-wise in the graph (as torchao's
    row-wise recipe does), the fp8 weight [N, K] with its [N, 1] scale."""
    x_scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / torch.finfo(E4M3).max
    xq = (x.float() / x_scale).to(E4M3)
    return torch._scaled_mm(xq, wq.t(), x_scale, w_scale.t(), bias=bias, out_dtype=BF16)


def _compile(fn, mode):
    return torch.compile(fn, fullgraph=True, **({} if mode == "default" else {"mode": mode}))


def _close(out, ref, tol=2e-2):
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err < tol, f"relative error {err:.3e}"


def _tile_in_code(code: str, tile: dict) -> bool:
    return all(re.search(rf"{k}\s*:\s*tl\.constexpr\s*=\s*{tile[k]}\b", code) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))


@pytest.mark.parametrize("mode", MODES)
def test_a_compiled_fp8_linear_is_tuned_by_gemmtune_and_matches_torch(mode):
    from gemmtune.offline.fp8_spec import quantise

    x = torch.randn(M, K, device="cuda", dtype=BF16)
    wq, w_scale = quantise(torch.randn(N, K, device="cuda"), E4M3, True)
    bias = torch.randn(N, device="cuda").to(BF16)
    with gi.installed() as handler, gi.benchmark_probe() as probe:
        out = _compile(fp8_linear, mode)(x, wq, w_scale, bias)
    _close(out, fp8_linear(x, wq, w_scale, bias))
    assert handler.stats["scaled_mm_tuned"] == 1 and handler.stats["scaled_mm_hit"] == 1, handler.stats
    assert handler.stats["scaled_mm_fallback"] == 0 and probe.choices == 0, (handler.stats, probe.names)
    (pick,) = handler.picks.values()
    assert pick.exact and pick.problem.startswith(f"scaled_mm({M}x{K}, {K}x{N}, rowwise, bias {N}")
    entry = pick.entries[0]
    assert handler.built == [("scaled_mm", entry["template_id"], entry_options(entry))]


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast_accum"])
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("mode", MODES)
def test_a_triton_scaled_mm_pick_is_built_as_inductors_mm_template_with_its_tile(mode, rowwise, fast):
    from torch._inductor.utils import run_and_get_code

    tensors = quantised(rowwise)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16, fast_accum=fast)
    pick = scaled.scaled_entries(ki, Choice("triton_scaled_mm", "h", as_params(TILE), as_params({"swizzle": 4})))
    with gi.installed(tune_on_miss=False) as handler, gi.benchmark_probe() as probe:
        handler.add(pick)
        out, code = run_and_get_code(_compile(lambda *t: scaled_relu(*t, fast=fast), mode), *tensors)
    _close(out, scaled_relu(*tensors, fast=fast), 4e-2 if fast else 2e-2)
    assert handler.stats["scaled_mm_hit"] == 1 and probe.choices == 0, (handler.stats, probe.names)
    assert [(op, uid, kw["GROUP_M"], kw["USE_FAST_ACCUM"]) for op, uid, kw in handler.built] == [
        ("scaled_mm", "triton::mm", 4, fast)]
    text = "\n".join(code)
    assert _tile_in_code(text, TILE) and "extern_kernels._scaled_mm(" not in text


@pytest.mark.parametrize("mode", MODES)
def test_a_library_pick_is_the_cublaslt_extern(mode):
    from torch._inductor.utils import run_and_get_code

    tensors = quantised(True)
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=BF16)
    with gi.installed(tune_on_miss=False) as handler, gi.benchmark_probe() as probe:
        handler.add(scaled.scaled_entries(ki, Choice("aten_scaled_mm", None)))
        out, code = run_and_get_code(_compile(scaled_relu, mode), *tensors)
    torch.testing.assert_close(out, scaled_relu(*tensors), rtol=0, atol=0)  # the same cuBLASLt call
    assert handler.built == [("scaled_mm", "aten::_scaled_mm", {})] and probe.choices == 0
    assert "extern_kernels._scaled_mm(" in "\n".join(code)


def test_a_tuned_triton_pick_is_built_with_the_config_gemmtune_timed(monkeypatch):
    """The pool cut to the Triton template: a real tune picks a `triton_scaled_mm` config, and Inductor's
    mm template is built with that tile and swizzle, nothing benchmarked."""
    from gemmtune.templates.triton.scaled_mm import TritonScaledMMTemplate

    space = [TILE, dict(TILE, BLOCK_M=128, num_warps=8)]
    monkeypatch.setattr(scaled, "scaled_pool", lambda *a: [TritonScaledMMTemplate(space=space)])
    tensors = quantised(True)
    with gi.installed() as handler, gi.benchmark_probe() as probe:
        out = _compile(scaled_relu, "max-autotune-no-cudagraphs")(*tensors)
    _close(out, scaled_relu(*tensors))
    (pick,) = handler.picks.values()
    assert pick.source.startswith("triton_scaled_mm") and probe.choices == 0
    ((op, uid, built),) = handler.built
    assert (op, uid) == ("scaled_mm", "triton::mm")
    assert {k: built[k] for k in TILE_KEYS} in space and built["GROUP_M"] == pick.entries[0]["GROUP_M"]


def test_a_float8_output_is_left_to_inductor_and_a_float32_one_is_answered():
    """gemmtune does not tune float8 outputs (`out_dtype=None`): Inductor's own lowering builds it, no error."""
    a, b, sa, sb = quantised(False, bias=False)
    fp8_out = lambda *t: torch._scaled_mm(*t)  # noqa: E731
    fp32_out = lambda *t: torch._scaled_mm(*t, out_dtype=torch.float32).relu()  # noqa: E731
    with gi.installed() as handler:
        out = _compile(fp8_out, "default")(a, b, sa, sb)
        assert handler.stats["scaled_mm_fallback"] == 1 and handler.stats["scaled_mm_hit"] == 0, handler.stats
        out32 = _compile(fp32_out, "default")(a, b, sa, sb)
    assert out.dtype == E4M3
    _close(out, fp8_out(a, b, sa, sb), 7e-2)  # float8 rounding of the output
    _close(out32, fp32_out(a, b, sa, sb), 1e-3)
    assert handler.stats["scaled_mm_hit"] == 1 and handler.stats["scaled_mm_tuned"] == 1, handler.stats
