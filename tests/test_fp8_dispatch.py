"""scaled_mm dispatch: the eager warm path, a model's torch._scaled_mm calls routed (patch, warmup), the CLI.

The model is written here and quantises as torchao's float8 inference does: its weight once, per row
(scale = amax / 448), its activation on every forward, per row, then `torch._scaled_mm` in bfloat16.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.cli import main
from gemmtune.dispatch import fp8
from gemmtune.dispatch.table import TABLE

E4M3, BF16 = torch.float8_e4m3fn, torch.bfloat16
FP8_MAX = torch.finfo(E4M3).max


def rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (x.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (x / scale).to(E4M3), scale


class Float8Linear(nn.Module):
    """y = x @ W^T (+ b) with row-wise fp8 scales, through torch._scaled_mm."""

    def __init__(self, k: int, n: int, bias: bool = False):
        super().__init__()
        self.w, w_scale = rowwise(torch.randn(n, k))
        self.register_buffer("w_scale", w_scale.t().contiguous())  # [1, N]
        self.b = torch.randn(n).to(BF16) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, x_scale = rowwise(x)
        return torch._scaled_mm(xq, self.w.t(), x_scale, self.w_scale, bias=self.b, out_dtype=BF16)


def model() -> nn.Module:
    return nn.Sequential(Float8Linear(32, 64, bias=True), nn.ReLU(), Float8Linear(64, 16))


def tensorwise_operands():
    a, b = torch.randn(16, 32).to(E4M3), torch.randn(48, 32).to(E4M3).t()
    return a, b, torch.tensor(0.5), torch.tensor(2.0)


# -- eager ------------------------------------------------------------------------------------------

def test_eager_warm_path_is_one_lookup_of_torch_op():
    tensors = tensorwise_operands()
    first = gemmtune.scaled_mm(*tensors)
    stats = gemmtune.dispatch_stats()
    assert (stats["tunes"], stats["misses"], stats["hits"]) == (1, 1, 0)
    again = gemmtune.scaled_mm(*tensors)
    assert gemmtune.dispatch_stats()["hits"] == 1 and gemmtune.dispatch_stats()["tunes"] == 1
    assert torch.equal(first, again)
    runner = TABLE.runner("scaled_mm", fp8.scaled_key(tensors, BF16, False, None))
    assert runner.func is torch._scaled_mm and runner.keywords == {"out_dtype": BF16, "use_fast_accum": False}


def test_fast_accum_and_out_dtype_are_other_problems():
    tensors = tensorwise_operands()
    gemmtune.scaled_mm(*tensors)
    gemmtune.scaled_mm(*tensors, use_fast_accum=True)
    out = gemmtune.scaled_mm(*tensors, out_dtype=torch.float32)
    assert gemmtune.dispatch_stats()["tunes"] == 3 and out.dtype == torch.float32


def test_backends_as_a_list_still_dispatches():
    tensors = tensorwise_operands()
    out = gemmtune.scaled_mm(*tensors, backends=["extern"])
    assert torch.equal(out, torch._scaled_mm(*tensors, out_dtype=BF16))
    with pytest.raises(gemmtune.BackendError):
        gemmtune.scaled_mm(*tensors, backends=42)


# -- a model's torch._scaled_mm calls ---------------------------------------------------------------

def test_warmup_records_a_models_scaled_mm_calls_and_routes_it():
    m, x = model(), torch.randn(8, 32)
    want = m(x)
    report = gemmtune.warmup(m, x, progress=False)
    problems = sorted(r.problem for r in report.rows)
    assert problems == ["scaled_mm(8x32, 32x64, rowwise, bias 64, bfloat16)",
                        "scaled_mm(8x64, 64x16, rowwise, bfloat16)"]
    assert all(r.winner == "aten_scaled_mm" for r in report.rows) and report.tuned == 2
    assert fp8.is_routed(m)
    hits = gemmtune.dispatch_stats()["hits"]
    assert torch.equal(m(x), want)
    assert gemmtune.dispatch_stats()["hits"] == hits + 2 and gemmtune.dispatch_stats()["tunes"] == 2
    gemmtune.clear_dispatch_cache()
    again = gemmtune.warmup(m, x, progress=False)  # a new process would read the picks from the store
    assert again.from_store == 2 and again.tuned == 0


def test_patch_routes_scaled_mm_and_unpatch_undoes_it():
    m, x = model(), torch.randn(4, 32)
    want = m(x)
    gemmtune.patch(m, scaled_mm=True)
    assert torch.equal(m(x), want) and gemmtune.dispatch_stats()["tunes"] == 2
    assert torch.equal(m(x), want) and gemmtune.dispatch_stats()["tunes"] == 2
    gemmtune.unpatch(m)
    assert not fp8.is_routed(m)
    gemmtune.clear_dispatch_cache()
    m(x)
    assert gemmtune.dispatch_stats()["misses"] == 0


def test_the_router_leaves_calls_gemmtune_does_not_tune_to_torch():
    a, b, sa, sb = tensorwise_operands()
    with fp8.ScaledMMRouter():
        fp8_out = torch._scaled_mm(a, b, sa, sb)  # out_dtype None: a float8 output
        padded = torch._scaled_mm(a, b.contiguous(), sa, sb, out_dtype=BF16)  # torch's CPU kernel takes it
        tuned = torch._scaled_mm(a, b, sa, sb, out_dtype=BF16)
    assert fp8_out.dtype == E4M3 and torch.equal(padded, tuned)
    assert gemmtune.dispatch_stats()["tunes"] == 1


# -- the CLI ----------------------------------------------------------------------------------------

def test_cli_tunes_scaled_mm_then_hits_the_store(tmp_path, capsys):
    store = str(tmp_path / "s.sqlite")
    args = ["tune", "--op", "scaled_mm", "--dtype", "float8_e4m3fn", "--scales", "rowwise", "--shape", "16x32x48",
            "--no-progress", "--store", store]
    assert main(args) == 0
    assert "AUTOTUNE scaled_mm(16x32, 32x48, rowwise, bfloat16)" in capsys.readouterr().out
    assert main(args) == 0
    assert "cache hit: scaled_mm 16x32x48 float8_e4m3fn rowwise B=col" in capsys.readouterr().out


def test_cli_tunes_an_fp8_suite(tmp_path, capsys):
    suite = tmp_path / "fp8.json"
    suite.write_text(json.dumps({"shapes": [{"op": "scaled_mm", "M": 16, "K": 32, "N": 16, "scales": s}
                                            for s in ("tensorwise", "rowwise")]}))
    assert main(["tune", "--suite", str(suite), "--no-progress", "--store", "memory"]) == 0
    out = capsys.readouterr().out
    assert "scaled_mm(16x32, 32x16, tensorwise, bfloat16)" in out and "rowwise" in out


@pytest.mark.parametrize("args, needle", [
    (["--op", "scaled_mm", "--scales", "blockwise"], "argument --scales: invalid choice"),
    (["--op", "scaled_mm", "--dtype", "float16"], "argument --dtype: scaled_mm needs an fp8 dtype"),
    (["--op", "scaled_mm", "--b-layout", "row"], "argument --b-layout: scaled_mm's B must be column-major"),
    (["--op", "scaled_mm", "--shape", "16x24x16"], "must be multiples of 16"),
    (["--op", "mm", "--scales", "rowwise"], "argument --scales: 'rowwise' belongs to op scaled_mm"),
    (["--dtype", "float8_e4m3fn"], "use op scaled_mm"),
])
def test_cli_bad_fp8_values_exit_2_with_one_line(args, needle, capsys):
    assert main(["tune", "--no-progress", "--store", "off", "--shape", "16x32x16", *args]) == 2  # a later --shape wins
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_the_fp8_suite_is_the_llama_projections():
    from gemmtune.offline.suite import ProblemSpec, load_suite

    specs = load_suite("bench/shapes_fp8.json")
    assert len(specs) == 2 * 4 * 4 * 2
    assert {s.M for s in specs} == {16, 128, 1024, 8192} and {s.scales for s in specs} == {"tensorwise", "rowwise"}
    assert {(s.K, s.N) for s in specs if s.name.startswith("llama3-8b")} == {
        (4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096)}
    assert {(s.K, s.N) for s in specs if s.name.startswith("llama3-70b")} == {
        (8192, 8192), (8192, 1024), (8192, 28672), (28672, 8192)}
    a, b, sa, sb = ProblemSpec(16, 32, 16, op="scaled_mm", dtype="float8_e4m3fn", b_layout="col",
                               scales="rowwise").tensors("cpu")
    assert b.t().is_contiguous() and sa.shape == (16, 1) and sb.shape == (1, 16)
    assert torch.equal(gemmtune.scaled_mm(a, b, sa, sb), torch._scaled_mm(a, b, sa, sb, out_dtype=BF16))


def test_under_torch_compile_it_traces_to_torch_op():
    tensors = tensorwise_operands()
    compiled = torch.compile(lambda *t: gemmtune.scaled_mm(*t), fullgraph=True, backend="eager")
    assert torch.equal(compiled(*tensors), torch._scaled_mm(*tensors, out_dtype=BF16))
    assert gemmtune.dispatch_stats()["tunes"] == 0  # nothing tuned at trace time (docs/FP8.md)


def test_a_deep_copy_of_a_routed_model_runs_its_own_layers():
    import copy

    m, x = model(), torch.randn(4, 32)
    gemmtune.patch(m, scaled_mm=True)
    twin = copy.deepcopy(m)
    twin[0].w = rowwise(torch.randn(64, 32))[0]  # the copy's weight differs from the original's
    assert fp8.is_routed(twin) and not torch.equal(twin(x), m(x))
    gemmtune.unpatch(twin)
    assert not fp8.is_routed(twin) and "forward" not in vars(twin)
