"""The engine: one heuristics call, layout rule, compile failures, correctness gate."""

import pytest
import torch

import gemmtune
from gemmtune.measure.timers import Measurement
from gemmtune.templates import heuristics
from gemmtune.core.errors import BackendError, InputError, NoCandidatesError
from gemmtune.core.inputs import KernelInputs
from gemmtune.store.sqlite import Store
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate

from helpers import ScriptedTemplate


def mats(M=48, K=32, N=40):
    return torch.randn(M, K), torch.randn(K, N)


def test_get_template_configs_called_once_with_every_template(monkeypatch):
    calls = []
    real = heuristics.get_template_configs

    def spy(ki, templates, op_name, finalize=()):
        calls.append(([t.uid for t in templates], op_name))
        return real(ki, templates, op_name, finalize)

    monkeypatch.setattr(heuristics, "get_template_configs", spy)
    templates = [AtenTemplate("mm"), NumpyTemplate(), ScriptedTemplate("s1"), ScriptedTemplate("s2")]
    gemmtune.tune("mm", *mats(), templates=templates)
    assert calls == [(["aten_mm", "numpy_blas", "s1", "s2"], "mm")]


def test_finalize_hook_sees_every_templates_choices_in_one_call():
    seen = []

    def hook(ki, choices, op_name):
        seen.append({c.template_uid for c in choices})
        return choices

    templates = [AtenTemplate("mm"), NumpyTemplate(), ScriptedTemplate("s1"), ScriptedTemplate("s2")]
    gemmtune.tune("mm", *mats(), templates=templates, finalize=[hook])
    assert seen == [{"aten_mm", "numpy_blas", "s1", "s2"}]


def test_global_hook_can_pin_one_choice():
    def pin(ki, choices, op):
        return [c for c in choices if c.template_uid == "s1" and c.config_dict["TILE"] == 16 and c.runtime_dict["group"] == 2]

    remove = gemmtune.add_finalize_hook(pin)
    try:
        sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), ScriptedTemplate("s1")])
    finally:
        remove()
    assert sel.n_choices == 1 and sel.winner.config_dict == {"TILE": 16}


def test_layout_flexible_when_only_library_kernels():
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), NumpyTemplate()])
    assert isinstance(sel.layout, gemmtune.FlexibleLayout)
    assert all(isinstance(t.choice.layout, gemmtune.FlexibleLayout) for t in sel.timings)


def test_layout_fixed_once_a_template_competes():
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), ScriptedTemplate()])
    assert isinstance(sel.layout, gemmtune.FixedLayout)
    assert sel.layout.stride == (40, 1)
    assert all(isinstance(t.choice.layout, gemmtune.FixedLayout) for t in sel.timings)


def test_layout_flexible_again_when_a_hook_removes_templates():
    ki = KernelInputs.from_tensors("mm", *mats())
    choices = heuristics.get_template_configs(ki, [AtenTemplate("mm"), ScriptedTemplate()], "mm",
                                              finalize=[lambda k, cs, op: [c for c in cs if c.is_extern]])
    assert [c.layout.kind for c in choices] == ["flexible"]


def test_backends_extern_only_is_flexible_and_cpu_default_uses_numba():
    a, b = mats()
    sel = gemmtune.tune("mm", a, b, backends=("extern",))
    assert sel.layout.kind == "flexible"
    assert {t.choice.template_uid for t in sel.timings} == {"aten_mm"}  # torch's own kernels only
    sel = gemmtune.tune("mm", a, b, backends=("extern", "numpy"))
    assert {t.choice.template_uid for t in sel.timings} == {"aten_mm", "numpy_blas"}


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match="unknown family"):
        gemmtune.tune("mm", *mats(), backends=("cublas",))
    with pytest.raises(BackendError, match="strategy"):
        gemmtune.tune("mm", *mats(), strategy="random")


def test_choice_that_fails_to_compile_is_dropped_and_reported():
    broken = ScriptedTemplate("broken", mode="compile_error")
    good = ScriptedTemplate("good")
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), broken, good], strategy="exhaustive")
    statuses = {t.choice.template_uid: t.status for t in sel.timings}
    assert statuses["broken"] == "compile_failed"
    assert all(t.status == "ok" for t in sel.timings if t.choice.template_uid != "broken")
    assert "shared memory" in next(t.detail for t in sel.timings if t.choice.template_uid == "broken")
    assert "compile failed" in gemmtune.autotune_table(sel)
    assert sel.winner.template_uid != "broken"


def test_compile_timeout_drops_the_choice():
    slow = ScriptedTemplate("slow", mode="slow_compile", n_configs=1, sleep_s=3.0)
    settings = gemmtune.Settings(compile_timeout_s=0.5)
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), slow], settings=settings)
    assert {t.status for t in sel.timings if t.choice.template_uid == "slow"} == {"compile_failed"}
    assert "TimeoutError" in next(t.detail for t in sel.timings if t.choice.template_uid == "slow")
    assert sel.compile_s < 2.5


def test_every_template_failing_still_runs_the_library_kernel():
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), ScriptedTemplate(mode="compile_error")])
    assert sel.winner.template_uid == "aten_mm"


def test_no_candidates_at_all_is_a_clear_error():
    with pytest.raises(NoCandidatesError, match="no template offers a candidate"):
        gemmtune.tune("mm", *mats(), templates=[])
    with pytest.raises(NoCandidatesError, match="every candidate failed to compile"):
        gemmtune.tune("mm", *mats(), templates=[ScriptedTemplate(mode="compile_error")])


def test_wrong_candidate_is_excluded_and_reported():
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), ScriptedTemplate("bad", mode="wrong")],
                        strategy="exhaustive")
    bad = [t for t in sel.timings if t.choice.template_uid == "bad"]
    assert bad and all(t.status == "wrong_result" and t.ms is None for t in bad)
    assert sel.winner.template_uid == "aten_mm"
    assert "wrong result" in gemmtune.autotune_table(sel)


def test_selection_kernel_runs_the_winner():
    a, b = mats()
    sel = gemmtune.tune("mm", a, b, templates=[ScriptedTemplate()])
    torch.testing.assert_close(sel(a, b), a @ b)


def test_benchmark_runs_counts_every_timing():
    templates = [AtenTemplate("mm"), ScriptedTemplate(n_configs=8, runtime=(1, 2, 4))]
    exh = gemmtune.tune("mm", *mats(), templates=templates, strategy="exhaustive", store=Store(":memory:"))
    pre = gemmtune.tune("mm", *mats(), templates=templates, strategy="prescreen",
                        settings=gemmtune.Settings(top_x=2, cpu_configs=None), store=Store(":memory:"))
    def finalists(sel):
        return sum(t.stage == "finalist" for t in sel.timings)

    # exhaustive: 25 choices; prescreen: 8 configs + 2 kept x 2 other groups + 1 extern (on CPU a kept
    # config twice as slow as the fastest choice skips stage 2, and such a finalist the re-time: when only
    # one finalist is left within reach, nothing is re-timed: never a lone finalist); both + finalists.
    assert finalists(exh) in (0, 2, 3, 4) and finalists(pre) in (0, 2, 3, 4)
    assert exh.benchmark_runs == 25 + finalists(exh)
    timed = sum(t.status == "ok" for t in pre.timings)
    assert 9 <= timed <= 13 and pre.benchmark_runs == timed + finalists(pre)
    assert sum(t.status == "not_benchmarked" for t in pre.timings) == 25 - timed


def test_cpu_prescreen_tries_the_first_cpu_configs_of_each_template():
    templates = [AtenTemplate("mm"), ScriptedTemplate(n_configs=8, runtime=(1, 2, 4))]
    sel = gemmtune.tune("mm", *mats(), templates=templates, strategy="prescreen",
                        settings=gemmtune.Settings(cpu_configs=2), store=Store(":memory:"))
    tried = {t.choice.config_dict["TILE"] for t in sel.timings if not t.choice.is_extern and t.status == "ok"}
    offered = [c["TILE"] for c in ScriptedTemplate(n_configs=8).compile_configs(None)]
    assert tried and tried <= set(offered[:2])  # the template's own order: its first two configs


def test_zero_size_problem_is_an_input_error():
    with pytest.raises(InputError, match="M=0"):
        gemmtune.tune("mm", torch.randn(0, 4), torch.randn(4, 3))


class SplitTimer:
    """A fake GPU-like timer: fixed GPU and host times, the cost their maximum (as CudaTimer's)."""

    def time(self, fn, *, warm=False, stage="final"):  # the Timer protocol
        fn()
        return Measurement(0.030, gpu_ms=0.002, host_ms=0.030)

    def time_interleaved(self, fns, rounds):
        for fn in fns:
            fn()
        return [Measurement(0.030 + i / 1000, gpu_ms=0.002, host_ms=0.030 + i / 1000) for i in range(len(fns))]


def test_gpu_and_host_times_are_recorded_for_every_timed_choice(monkeypatch):
    from gemmtune.measure import runners

    monkeypatch.setattr(runners, "timer_for", lambda device, settings: SplitTimer())
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), NumpyTemplate(), ScriptedTemplate()])
    timed = [t for t in sel.timings if t.ms is not None]
    assert timed and all(t.gpu_ms == 0.002 and t.host_ms is not None and t.ms == max(t.gpu_ms, t.host_ms)
                         for t in timed)
    assert any(t.stage == "finalist" for t in timed)


def test_effort_levels_are_presets_under_explicit_settings():
    quick = gemmtune.Settings.from_env({}, effort="quick")
    assert (quick.strategy, quick.stage0_n, quick.top_x) == ("model_pruned", 8, 2)
    default = gemmtune.Settings.from_env({})
    assert (default.strategy, default.stage0_n, default.top_x) == ("model_pruned", 14, 4)
    assert default.with_(effort="default") == default
    assert gemmtune.Settings.from_env({}, effort="quick", strategy="prescreen").strategy == "prescreen"
    assert gemmtune.Settings().with_(effort="max").strategy == "exhaustive"
    with pytest.raises(ValueError, match="effort"):
        gemmtune.Settings.from_env({}, effort="insane")
    with pytest.raises(ValueError, match="budget_s"):
        gemmtune.Settings(budget_s=0)


def test_time_budget_stops_and_returns_the_best_so_far():
    slow = ScriptedTemplate("slow", mode="slow_compile", n_configs=4, sleep_s=1.5)
    store = Store(":memory:")
    settings = gemmtune.Settings(budget_s=0.5, compile_workers=1)
    a, b = mats()
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), NumpyTemplate(), slow], settings=settings,
                        store=store)
    assert sel.budget_exhausted
    assert sel.winner.is_extern  # the library kernels are timed first, whatever the budget
    assert sel.tuning_s < 5.0
    text = gemmtune.autotune_table(sel)
    assert "time budget" in text and "BudgetExceeded" not in text
    # Nothing the budget cut short is remembered as decided: the next tune is not a full hit.
    again = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), NumpyTemplate(),
                                                 ScriptedTemplate("slow", mode="slow_compile", n_configs=4,
                                                                  sleep_s=0.0)], store=store)
    assert not again.cache_hit and any(t.choice.template_uid == "slow" and t.ms for t in again.timings)


def test_engine_compiles_only_what_prune_kept_and_prunes_once(monkeypatch):
    """A strategy's `prune` runs once, before compiling: pruned binaries are never built, its
    `search` sees only kept choices, and the pruned ones are reported as not benchmarked."""
    from gemmtune.search import STRATEGIES, ExhaustiveOptions, Strategy, exhaustive

    pruned_calls, searched = [], []

    def prune(choices, options):
        pruned_calls.append(len(choices))
        return [c for c in choices if c.is_extern or c.config_dict["TILE"] == 8]

    def search(choices, measure, options):
        searched.extend(choices)
        return exhaustive(choices, measure, options)

    monkeypatch.setitem(STRATEGIES, "exhaustive", Strategy("exhaustive", search, prune, ExhaustiveOptions))
    scripted = ScriptedTemplate("s1", n_configs=4)
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), scripted], strategy="exhaustive",
                        store=Store(":memory:"))
    assert pruned_calls == [9]  # 4 configs x 2 runtime values + aten_mm, pruned once
    assert len(set(scripted.compiled)) == 1  # only TILE=8's binary was compiled
    assert searched and all(c.is_extern or c.config_dict["TILE"] == 8 for c in searched)
    assert sum(t.status == "not_benchmarked" for t in sel.timings) == 6
    assert sel.strategy == "exhaustive"


def test_model_pruned_on_cpu_runs_as_prescreen():
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), ScriptedTemplate("s1")],
                        strategy="model_pruned", store=Store(":memory:"))
    assert sel.strategy == "prescreen"


def test_engine_decides_through_search_final(monkeypatch):
    """tune's last step is `gemmtune.search.final.final_decision`, through the pipeline the offline
    replays run too (`gemmtune.pipeline.steps`)."""
    from gemmtune.pipeline import steps
    from gemmtune.search import final

    calls = []

    def spy(ranked, records, retime, rule, **kw):
        calls.append(rule)
        return final.final_decision(ranked, records, retime, rule, **kw)

    monkeypatch.setattr(steps, "final_decision", spy)
    gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), NumpyTemplate()], store=Store(":memory:"),
                  settings=gemmtune.Settings(finalists=2))
    assert [(r.finalists, r.rounds) for r in calls] == [(2, 15)]
