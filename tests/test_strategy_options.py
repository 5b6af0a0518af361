"""Each strategy owns its options: one frozen type per strategy, every knob with its doc and default,
an option set per effort, and another strategy's options refused with a TypeError."""

import dataclasses

import pytest
import torch

from gemmtune.core.choices import Choice, as_params
from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.core.settings import EFFORT_NAMES, Settings
from gemmtune.offline.replay import ReplayShape, decide
from gemmtune.pipeline.plan import default_options, plan_for, replay_plan, strategy_options
from gemmtune.search import (STRATEGIES, ModelPrunedOptions, Options, PrescreenOptions, ProblemDims, Strategy,
                             exhaustive, knob)

PAIRS = [(a, b) for a in sorted(STRATEGIES) for b in sorted(STRATEGIES) if a != b]


def _gpu_problem():
    meta = lambda *size: TensorMeta(size, (size[1], 1), torch.bfloat16, "cuda:0")  # noqa: E731
    return KernelInputs("mm", (meta(256, 128), meta(128, 64)))


def _choices():
    cfg = lambda bm: as_params(dict(BLOCK_M=bm, BLOCK_N=128, BLOCK_K=64, num_stages=4, num_warps=8))  # noqa: E731
    return [Choice("t", "h", cfg(bm), as_params({"swizzle": s}), family="t") for bm in (16, 64, 128)
            for s in (1, 8)] + [Choice("lib", None)]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_knob_has_a_doc_and_a_default(name):
    strategy = STRATEGIES[name]
    kind = strategy.options
    assert issubclass(kind, Options) and dataclasses.is_dataclass(kind)
    assert kind.__dataclass_params__.frozen
    bare = kind()  # every knob has a default
    assert strategy.knobs == kind.knobs() and set(kind.knobs()) == {f.name for f in dataclasses.fields(kind)}
    for knob_name, (doc, default) in kind.knobs().items():
        assert isinstance(doc, str) and len(doc.split()) >= 3, f"{name}.{knob_name}: no doc"
        assert getattr(bare, knob_name) == default
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(bare, "x", 1)


def test_each_strategy_sees_only_its_knobs():
    assert STRATEGIES["exhaustive"].knobs == {}
    assert {"top_x", "stage1", "stage2_within", "configs_per_template"} == set(STRATEGIES["prescreen"].knobs)
    assert set(STRATEGIES["model_pruned"].knobs) == set(STRATEGIES["prescreen"].knobs) | {"stage0_n", "model", "problem"}
    assert type(PrescreenOptions().given(stage0_n=3, top_x=2)) is PrescreenOptions  # a knob not its own is ignored


@pytest.mark.parametrize("mine,other", PAIRS)
def test_a_strategy_refuses_another_strategys_options(mine, other):
    strategy, wrong = STRATEGIES[mine], STRATEGIES[other].options()
    measure = lambda cs, stage: [1.0] * len(cs)  # noqa: E731
    for call in (lambda: strategy.prune(_choices(), wrong), lambda: strategy.search(_choices(), measure, wrong),
                 lambda: strategy(_choices(), measure, wrong), lambda: replay_plan(mine, wrong)):
        with pytest.raises(TypeError, match=f"{mine!r} takes {strategy.options.__name__}, got {type(wrong).__name__}"):
            call()
    shape = ReplayShape((8, 8, 8), {c: 1.0 + i for i, c in enumerate(_choices())})
    with pytest.raises(TypeError, match=strategy.options.__name__):
        decide(shape, mine, wrong)
    assert decide(shape, mine, default_options(ProblemDims(8, 8, 8), mine)).pick is not None  # its own: runs


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("effort", EFFORT_NAMES)
def test_every_effort_is_a_valid_option_set_of_every_strategy(name, effort):
    strategy = STRATEGIES[name]
    preset = strategy.preset(effort)
    assert type(preset) is strategy.options
    if strategy.knobs:
        assert set(strategy.efforts) == set(EFFORT_NAMES)  # each effort says what it means to this strategy
    for knob_name, value in strategy.efforts.get(effort, {}).items():
        assert getattr(preset, knob_name) == value


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("effort", EFFORT_NAMES)
def test_the_plan_gives_each_strategy_its_efforts_option_set(name, effort):
    """`Settings(effort=...)` and the strategy's own presets agree: what the plan builds from the
    effort's settings holds the knob values the strategy declares for that effort."""
    ran, options = strategy_options(Settings().with_(effort=effort, strategy=name), _gpu_problem(), [])
    assert ran == name and type(options) is STRATEGIES[name].options
    preset = STRATEGIES[name].preset(effort)
    for knob_name in STRATEGIES[name].efforts.get(effort, {}):
        assert getattr(options, knob_name) == getattr(preset, knob_name)


def test_the_aliases_take_the_default_efforts_option_set_whatever_the_settings_say():
    for alias in ("default", "budgeted"):
        ran, options = strategy_options(Settings(strategy=alias, top_x=7, stage0_n=3), _gpu_problem(), [])
        assert ran == "model_pruned" and isinstance(options, ModelPrunedOptions)
        assert (options.top_x, options.stage0_n) == (4, 14) == (Settings().top_x, Settings().stage0_n)
    mine = strategy_options(Settings(strategy="model_pruned", top_x=7, stage0_n=3), _gpu_problem(), [])[1]
    assert (mine.top_x, mine.stage0_n, mine.problem) == (7, 3, (256, 64, 128, 1, 2))


def test_the_cpu_plan_sets_prescreens_device_knobs():
    ki = KernelInputs.from_tensors("mm", torch.randn(64, 32), torch.randn(32, 16))
    plan = plan_for(Settings(strategy="prescreen", cpu_configs=2), ki)
    assert type(plan.options) is PrescreenOptions
    assert plan.options.configs_per_template == 2 and plan.options.stage2_within == 2.0
    gpu = strategy_options(Settings(strategy="prescreen", cpu_configs=2), _gpu_problem(), [])[1]
    assert gpu.configs_per_template is None and gpu.stage2_within is None


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_default_options_are_the_default_preset(name):
    opts = default_options(strategy=name)
    assert type(opts) is STRATEGIES[name].options
    assert opts.given(stage1={}) == STRATEGIES[name].preset("default").given(stage1={})


def test_model_pruned_runs_prescreens_prune_after_stage_0():
    kept = STRATEGIES["model_pruned"].prune(_choices(), ModelPrunedOptions(configs_per_template=1))
    assert [c.config_dict.get("BLOCK_M", "lib") for c in kept] == [16, 16, "lib"]  # stage 0 off: the first binary


def test_a_strategy_declared_with_a_wrong_preset_fails_at_once():
    with pytest.raises(TypeError):
        Strategy("x", exhaustive, options=PrescreenOptions, efforts={"quick": {"no_such_knob": 1}})
    with pytest.raises(ValueError, match="unknown effort 'fast'"):
        Strategy("x", exhaustive, options=PrescreenOptions, efforts={"fast": {"top_x": 1}})


def test_knob_declares_doc_and_default():
    @dataclasses.dataclass(frozen=True)
    class Mine(Options):
        width: int = knob("how many are kept", 3)
        table: dict = knob("a table, by name", factory=dict)

    assert Mine.knobs() == {"width": ("how many are kept", 3), "table": ("a table, by name", {})}
    assert Mine().table is not Mine().table  # a mutable default is made afresh
