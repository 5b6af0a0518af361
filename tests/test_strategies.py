"""Search strategies on recorded H200 timings (replay) and on hand-made data."""

import pytest

from gemmtune.core.choices import Choice, as_params
from gemmtune.offline.replay import ReplayShape, load_sweep, replay
from gemmtune.search import ExhaustiveOptions, PrescreenOptions, exhaustive, prescreen
from gemmtune.templates.triton.base import STAGE1_SWIZZLE

DEFAULT = PrescreenOptions(top_x=5, stage1={"triton_mm": {"swizzle": STAGE1_SWIZZLE}})


def test_exhaustive_has_zero_regret(sweep_path):
    for shape in load_sweep(sweep_path):
        out = replay(shape, "exhaustive", ExhaustiveOptions())
        assert out.regret_pct == 0.0
        assert out.benchmark_runs == len(shape.choices)


def templates_only(shapes):
    """The sweep without cuBLAS, so that regret measures the template search alone."""
    return [ReplayShape(s.shape, {c: ms for c, ms in s.times.items() if not c.is_extern}) for s in shapes]


@pytest.mark.parametrize("with_library", [True, False])
def test_prescreen_default_finds_exhaustive_winner_with_3x_fewer_runs(sweep_path, with_library):
    shapes = load_sweep(sweep_path) if with_library else templates_only(load_sweep(sweep_path))
    assert len(shapes) == 6
    total_pre = total_exh = 0
    for shape in shapes:
        pre = replay(shape, "prescreen", DEFAULT)
        exh = replay(shape, "exhaustive", ExhaustiveOptions())
        assert pre.regret_pct <= 0.5, (shape.shape, pre.regret_pct)
        total_pre += pre.benchmark_runs
        total_exh += exh.benchmark_runs
    assert total_exh >= 3 * total_pre


def test_prescreen_with_x1_loses_somewhere(sweep_path):
    # The top-X stage matters: keeping only one config misses the winner on this data (by more than 10%, asserted below).
    shapes = templates_only(load_sweep(sweep_path))
    worst = max(replay(s, "prescreen", PrescreenOptions(top_x=1, stage1={"triton_mm": {"swizzle": 2}})).regret_pct
                for s in shapes)
    assert worst > 10.0
    worst3 = max(replay(s, "prescreen", PrescreenOptions(top_x=3, stage1={"triton_mm": {"swizzle": 2}})).regret_pct
                 for s in shapes)
    assert 0.5 < worst3 < worst


def test_library_kernel_always_reaches_final_round(sweep_path):
    for shape in load_sweep(sweep_path):
        seen = []

        def measure(choices, stage):
            seen.extend((c, stage) for c in choices)
            return [shape.times[c] for c in choices]

        prescreen(shape.choices, measure, DEFAULT)
        assert (Choice("aten_mm", None), "final") in seen
        assert all(not c.is_extern for c, st in seen if st == "prescreen")


def _hand_made():
    # 3 configs x 2 swizzles + 1 extern; config B=2 is best only at swizzle 1.
    table = {(1, 1): 5.0, (1, 8): 4.0, (2, 1): 1.0, (2, 8): 3.0, (3, 1): 2.5, (3, 8): 2.0}
    times = {Choice("t", "h", as_params({"B": b}), as_params({"sw": s}), family="t"): ms for (b, s), ms in table.items()}
    times[Choice("lib", None)] = 1.5
    return times


def test_prescreen_on_hand_made_data():
    times = _hand_made()
    calls = []

    def measure(choices, stage):
        calls.append((stage, [c.config_dict.get("B", "lib") for c in choices]))
        return [times[c] for c in choices]

    ranked = prescreen(list(times), measure, PrescreenOptions(top_x=2, stage1={"t": {"sw": 8}}))
    # Stage 1 timed each config once at sw=8; configs 3 (2.0) and 2 (3.0) kept; config 1 dropped.
    assert calls[0] == ("prescreen", [1, 2, 3])
    assert sorted(calls[1][1], key=str) == sorted([2, 3, "lib"], key=str)
    assert ranked[0].choice.config_dict == {"B": 2} and ranked[0].ms == 1.0
    assert sum(len(c[1]) for c in calls) == 6  # 3 + 2 (other swizzle of kept) + 1 extern; stage-1 runs reused
    assert all(m.stage == "final" for m in ranked if m.choice.config_dict.get("B") in (2, 3))


def test_prescreen_within_skips_stage_2_for_binaries_far_slower_than_the_fastest():
    times = _hand_made()
    calls = []

    def measure(choices, stage):
        calls.append((stage, [c.config_dict.get("B", "lib") for c in choices]))
        return [times[c] for c in choices]

    # stage 1 at sw=8: configs 1, 2, 3 take 4.0, 3.0, 2.0.  top_x=3 would keep all three, but within
    # 1.5x of the fastest binary (2.0) only 3 and 2 (3.0) go on to their other runtime value.
    ranked = prescreen(list(times), measure, PrescreenOptions(top_x=3, stage1={"t": {"sw": 8}}, stage2_within=1.5))
    assert calls[0] == ("prescreen", [1, 2, 3])
    assert sorted(calls[1][1], key=str) == sorted([2, 3, "lib"], key=str)  # config 1 skips stage 2
    assert ranked[0].choice.config_dict == {"B": 2} and ranked[0].ms == 1.0
    assert len(calls) == 2 and sum(m.choice.is_extern for m in ranked) == 1


def test_first_configs_keeps_each_templates_first_binaries_with_every_runtime_value():
    from gemmtune.search import STRATEGIES, first_configs

    times = _hand_made()
    kept = first_configs(list(times), PrescreenOptions(configs_per_template=2))
    assert {c.config_dict.get("B", "lib") for c in kept} == {1, 2, "lib"} and len(kept) == 5
    assert first_configs(list(times), PrescreenOptions()) == list(times)  # None: every binary
    assert STRATEGIES["prescreen"].pruner is first_configs


def test_exhaustive_on_hand_made_data_measures_everything_once():
    times = _hand_made()
    n = []
    ranked = exhaustive(list(times), lambda cs, st: n.extend(cs) or [times[c] for c in cs], ExhaustiveOptions())
    assert len(n) == len(times) and ranked[0].ms == 1.0
    assert [m.ms for m in ranked] == sorted(times.values())


def test_failed_choices_rank_last_and_are_not_kept():
    times = _hand_made()
    broken = next(c for c in times if c.config_dict == {"B": 3})

    def measure(choices, stage):
        return [None if c.binary_key == broken.binary_key else times[c] for c in choices]

    ranked = prescreen(list(times), measure, PrescreenOptions(top_x=2, stage1={"t": {"sw": 8}}))
    assert ranked[-1].ms is None
    assert ranked[0].choice.config_dict == {"B": 2}


@pytest.mark.parametrize("x", [1, 3, 5, 10])
def test_prescreen_never_times_more_than_exhaustive(sweep_path, x):
    for shape in load_sweep(sweep_path):
        pre = replay(shape, "prescreen", PrescreenOptions(top_x=x, stage1={"triton_mm": {"swizzle": 8}}))
        assert pre.benchmark_runs <= len(shape.choices)


def test_a_ranking_is_of_timings_and_the_former_name_still_builds_one():
    from gemmtune.core.choices import Timing
    from gemmtune.search import ExhaustiveOptions, Measured, exhaustive

    a, b = Choice("a", None), Choice("b", None)
    ranked = exhaustive([a, b], lambda cs, stage: [2.0, None], ExhaustiveOptions())
    assert ranked == [Timing(a, 2.0, "final"), Timing(b, None, "final")]
    assert Measured(a, 2.0, "final") == ranked[0]
