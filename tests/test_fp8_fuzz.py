"""bench/fuzz.py --kind fp8 on CPU, with triton_scaled_mm under Triton's interpreter: random fp8 problems
give no wrong result from any kernel of the pool, gemmtune.scaled_mm or torch, and gemmtune refuses what
torch refuses.  torch's CPU kernel takes calls its CUDA kernel refuses (an odd K, a row-major B, two
e5m2 matrices), so on CPU torch's verdict is its meta kernel's checks for CUDA on meta copies plus the
dtype rules of its CUDA kernel (`cuda_rules`); each refusal the fuzzer probes is checked here against
both gemmtune's validator and those rules.  tests/gpu/test_fp8_fuzz_gpu.py asks torch itself on a GPU."""

import json
import os
import random

import pytest
import torch

pytest.importorskip("triton")
if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests run on machines without CUDA (tests/gpu covers CUDA)", allow_module_level=True)

import gemmtune  # noqa: E402
from gemmtune.core.inputs import KernelInputs  # noqa: E402
from gemmtune.templates.extern import AtenScaledMMTemplate  # noqa: E402
from gemmtune.templates.triton.base import SWIZZLES  # noqa: E402
from gemmtune.templates.triton.scaled_mm import TritonScaledMMTemplate  # noqa: E402

from helpers import load_bench  # noqa: E402

fz = load_bench("fuzz")
SPACE = [dict(fz.SMALL_SPACE[0])]  # one config x every swizzle: a case in a fraction of a second
BASE = fz.Case(0, 20, 32, 48, "tensorwise", "e4m3", "e4m3", "bf16", "bf16", 1, False, "col", 7)


def fz_ki(case):
    tensors = fz.operands(case, "cpu")
    return KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=fz.DTYPES[case.out_dtype],
                                     fast_accum=case.fast_accum)


@pytest.fixture(autouse=True)
def _memory_store(memory_store):
    """Each case tuned afresh (an in-memory store, an empty dispatch dict)."""


def test_seeded_cases_give_no_wrong_result_and_refusals_agree_with_torch():
    tally = fz.fuzz(14, seed=3, max_dim=40, device="cpu", space=SPACE)
    c = tally.counts
    assert (c["wrong"], c["mismatch"], c["error"], c["torch wrong"]) == (0, 0, 0, 0), tally.findings
    assert c["cases"] == 14 and c["refused, as torch"] >= 1 and c["computed"] >= 5
    assert tally.per_kernel["triton_scaled_mm", "ok"] >= 4 * c["computed"] - 4  # every swizzle (empty M: none)
    assert tally.per_kernel["aten_scaled_mm", "ok"] >= c["computed"] - 1 and tally.passed()


def test_the_same_seed_draws_the_same_cases():
    def draw(seed):
        rng = random.Random(seed)
        return [fz.draw(rng, i, 64) for i in range(30)]

    assert draw(5) == draw(5) and draw(5) != draw(6)
    cases = draw(5) + draw(6)
    assert {c.M % 16 != 0 for c in cases} == {True, False} and {c.scales for c in cases} >= {"tensorwise", "rowwise"}
    assert all(c.K % 16 == 0 and c.N % 16 == 0 for c in cases if not c.probe.startswith("odd"))


@pytest.mark.parametrize("case", [
    BASE._replace(M=1, scales="rowwise", bias=""),  # scale_a [1, 1]: was read as tensor-wise
    BASE._replace(M=1, scales="rowwise", fast_accum=True),
    BASE._replace(bias_step=2),  # a strided bias: was read as contiguous
    BASE._replace(M=3, scales="rowwise", a_dtype="e5m2", bias_step=2),
    BASE._replace(M=17, K=48, out_dtype="fp16", bias="fp16", b_dtype="e5m2"),
    BASE._replace(M=0, scales="rowwise"),
    BASE._replace(M=5, a_dtype="e5m2", special="nan", fast_accum=True),  # e4m3: see fuzz.draw
    BASE._replace(M=5, a_dtype="e5m2", scales="rowwise", special="inf"),
], ids=lambda c: c.describe())
def test_the_cases_that_found_defects_and_other_edges_pass(case):
    tally = fz.Tally()
    fz.run_case(case, "cpu", fz.SMALL_SPACE, tally)
    assert tally.counts["computed"] == 1 and tally.passed(), tally.findings
    binaries = len(TritonScaledMMTemplate(space=fz.SMALL_SPACE).compile_configs(fz_ki(case))) if case.M else 0
    assert tally.counts["kernels run"] == (1 + len(SWIZZLES) * binaries if case.M else 0)  # library + every swizzle


def _probe(name):
    changes = {"odd K": dict(K=33), "odd N": dict(N=40), "mixed scales": dict(scales="mixed"),
               "two e5m2": dict(a_dtype="e5m2", b_dtype="e5m2"), "row-major b": dict(b_layout="row"),
               "bias of another dtype": dict(bias="fp16"), "bias with float32 out": dict(out_dtype="fp32"),
               "row-wise without bf16 out": dict(scales="rowwise", out_dtype="fp16", bias="fp16")}
    return BASE._replace(probe=name, **changes[name])


@pytest.mark.parametrize("name", fz.PROBES)
def test_each_probed_refusal_is_torchs_rule_and_gemmtunes_typed_error(name):
    case = _probe(name)
    tensors = fz.operands(case, "cpu")
    why = fz.cuda_rules(tensors, case)
    shape_rule = name in ("odd K", "odd N", "mixed scales", "row-major b")
    assert why is not None and why.startswith("torch (meta)" if shape_rule else "torch (CUDA)"), why
    with pytest.raises(gemmtune.InputError):
        gemmtune.scaled_mm(*tensors[:4], **fz._call(tensors, case))
    assert fz.cuda_rules(fz.operands(BASE, "cpu"), BASE) is None
    tally = fz.Tally()
    fz.run_case(case, "cpu", SPACE, tally)
    assert tally.counts["refused, as torch"] == 1 and tally.passed() and len(tally.refusals) == 1


def test_a_wrong_kernel_and_a_disagreement_fail_the_run(monkeypatch):
    class Scaled(AtenScaledMMTemplate):
        uid = "scaled_by_1_5"

        def compile(self, choice, ki, example):
            launch = super().compile(choice, ki, example)
            return lambda tensors, out=None: launch(tensors, out).mul_(1.5)

    monkeypatch.setattr(fz, "pool", lambda ki, space: [Scaled()])
    tally = fz.Tally()
    fz.run_case(BASE, "cpu", SPACE, tally)
    assert tally.counts["wrong"] == 1 and not tally.passed()
    assert tally.findings[0]["what"].startswith("scaled_by_1_5") and "relative error" in tally.findings[0]["detail"]
    lax = fz.Tally()
    monkeypatch.setattr(fz, "cuda_rules", lambda tensors, case: None)  # torch said to take an odd K
    fz.run_case(_probe("odd K"), "cpu", SPACE, lax)
    assert lax.findings[0]["what"] == "gemmtune refuses, torch runs it" and not lax.passed()
    strict = fz.Tally()
    monkeypatch.setattr(fz, "cuda_rules", lambda tensors, case: "torch (CUDA): no")
    fz.run_case(BASE, "cpu", SPACE, strict)
    assert strict.findings[0]["what"] == "torch refuses, gemmtune runs it" and not strict.passed()


def test_the_script_prints_a_table_and_writes_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GEMMTUNE_EFFORT", "quick")
    out = tmp_path / "fuzz.json"
    assert fz.main(["--kind", "fp8", "--device", "cpu", "--cases", "4", "--seed", "1", "--max-dim", "32",
                    "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["counts"]["cases"] == 4 and data["passed"] and data["findings"] == []
    assert data["space"] == [dict(c) for c in fz.SMALL_SPACE]
    assert "| cases | refused, as torch | computed | kernels run | wrong |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        fz.main(["--max-dim", "8"])
