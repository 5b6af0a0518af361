"""bench/shapes_hard.json: the suite of problems autotuners struggle with loads, and holds each of its classes."""

import json
from pathlib import Path

import pytest

from gemmtune.offline.suite import load_suite

SUITE = Path(__file__).resolve().parents[1] / "bench" / "shapes_hard.json"
MODELS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3", "qwen2.5-7b", "qwen2.5-72b")


@pytest.fixture(scope="module")
def specs():
    return load_suite(SUITE)


def dims(spec):
    return (spec.M, spec.K, spec.N)


def test_the_suite_loads_with_unique_names_and_unique_problems(specs):
    assert 40 <= len(specs) <= 60
    names = [s.name for s in specs]
    assert len(set(names)) == len(names)
    problems = [s.describe() for s in specs]
    assert len(set(problems)) == len(problems)


def test_every_shape_names_a_source_the_description_gives(specs):
    description = json.loads(SUITE.read_text())["description"]
    assert sorted({s.name.split("-")[0] for s in specs if s.name.split("-")[0] not in description}) == []


def test_misaligned_problems_have_a_dimension_not_a_multiple_of_8(specs):
    misaligned = [s for s in specs if any(d % 8 for d in dims(s))]
    assert len(misaligned) >= 6
    assert (777, 1234, 5555) in {dims(s) for s in misaligned}
    assert {s.dtype for s in misaligned} == {"bfloat16"}


def test_vision_conv_problems_are_tall_and_narrow(specs):
    tall = {dims(s) for s in specs if s.M >= 100_000 and s.N <= 128 and s.K <= 160}
    assert len(tall) >= 6
    assert {(401408, 72, 20), (1605632, 32, 16)} <= tall
    assert (200704, 128, 512) in {dims(s) for s in specs}
    assert max(s.M for s in specs if s.N <= 128) >= 1_000_000


def test_tall_problems_with_a_tiny_k(specs):
    tiny = {(s.K, s.N) for s in specs if s.M >= 65536 and s.K <= 64 and s.N >= 256}
    assert {k for k, _ in tiny} >= {16, 32, 64}
    assert {n for _, n in tiny} >= {256, 1024}


@pytest.mark.parametrize("model", MODELS)
def test_each_large_model_has_decode_and_prefill_linear_problems(specs, model):
    ms = {s.M for s in specs if s.name.startswith(model + "-") and s.b_layout == "col" and s.op != "scaled_mm"}
    assert ms & {1, 16} and ms & {2048, 4096}


def test_fp8_problems_have_both_scale_kinds_and_the_qwen_72b_up_projection(specs):
    fp8 = [s for s in specs if s.op == "scaled_mm"]
    assert {s.scales for s in fp8} == {"tensorwise", "rowwise"}
    assert (2048, 8192, 29568) in {dims(s) for s in fp8 if s.scales == "rowwise"}
    assert {s.M for s in fp8} == {16, 2048}
