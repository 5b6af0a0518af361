"""The final decision (`gemmtune.search.final`) on recorded timings, and its use by replay and simulate."""

import pytest

from gemmtune.core.choices import Choice, Timing, as_params
from gemmtune.core.errors import NoCandidatesError
from gemmtune.core.settings import Settings
from gemmtune.pipeline import steps
from gemmtune.offline.dataset import ReplayShape
from gemmtune.offline.replay import decide, replay
from gemmtune.offline.simulate import StrategySpec, simulate
from gemmtune.pipeline.plan import default_options, final_rule, plan_for
from gemmtune.search import STRATEGIES, ExhaustiveOptions, ModelPrunedOptions, PrescreenOptions, ProblemDims
from gemmtune.search.final import FinalRule, final_pick

LIB = Choice("aten_mm", None)
RULE = final_rule(Settings(finalists=3))


def gen(n):
    return Choice("triton_mm", "h", as_params({"BLOCK_M": n}), family="triton")


def run_final(final, ranked_ms=None, rule=RULE, **kw):
    """final_pick over `final` = {choice: (cost, GPU ms, host ms)} after the interleaved re-time;
    the ranking is by `ranked_ms` (default: the final costs).  Returns (pick, re-timed choices)."""
    records, retimed = {}, []

    def retime(cs, rounds):
        retimed.extend(cs)
        for c in cs:
            cost, gpu, host = final[c]
            records[c] = Timing(c, cost, "finalist", gpu_ms=gpu, host_ms=host)
        return [final[c][0] for c in cs]

    ms = ranked_ms or {c: v[0] for c, v in final.items()}
    for c, t in ms.items():
        records[c] = Timing(c, t, "final")
    ranked = [Timing(c, ms[c], "final") for c in sorted(ms, key=ms.get)]
    return final_pick(ranked, records, retime, rule, **kw), retimed


def test_host_time_never_crowns_a_gpu_slower_kernel():
    """count_host_overhead: a generated kernel slower on the GPU than the library kernel does not win
    because torch.mm's host dispatch happens to cost more than its kernel."""
    slow_gpu, fast_gpu = gen(128), gen(64)
    final = {LIB: (0.029, 0.0196, 0.029), slow_gpu: (0.0233, 0.0233, 0.012), fast_gpu: (0.0250, 0.0190, 0.025)}
    assert run_final({c: final[c] for c in (LIB, slow_gpu)})[0] == LIB  # cheaper per call, 19% slower on the GPU
    assert run_final(final)[0] == fast_gpu  # faster on the GPU and than the library's cost


def test_a_generated_kernel_must_save_more_gpu_time_than_the_launch_time_it_adds():
    """launch_aware_final: 1 us of GPU saved for 8 us more host launch loses (a launch-bound eager model
    pays the 8 us); 15 us saved wins; with the rule off the first one wins as before."""
    small, big = gen(1), gen(2)
    lib = (0.060, 0.060, 0.012)  # (cost, GPU ms, host ms): a 60 us cuBLAS call launched in 12 us
    assert run_final({LIB: lib, small: (0.059, 0.059, 0.020)})[0] == LIB
    assert run_final({LIB: lib, big: (0.045, 0.045, 0.020)})[0] == big
    off = final_rule(Settings(finalists=3, launch_aware_final=False))
    assert run_final({LIB: lib, small: (0.059, 0.059, 0.020)}, rule=off)[0] == small
    # no host times recorded (CPU, replayed sweeps): the rule has nothing to weigh
    assert run_final({LIB: (0.060, None, None), small: (0.059, None, None)})[0] == small


def test_kernels_shorter_than_their_launch_tie_on_it_and_the_fastest_on_the_gpu_wins():
    """Every triton_mm config launches through one launcher: where each kernel runs shorter than that
    launch, the raw costs (max of GPU and host time) rank them by the host's noise. They tie on the
    template's launch instead, and the fastest on the GPU is picked."""
    fast, mid, slow = gen(16), gen(32), gen(64)
    lib_cost = (0.0276, 0.0168, 0.0276)  # torch's op: a slower launch and a slower kernel
    final = {fast: (0.0171, 0.0120, 0.0171), mid: (0.0163, 0.0150, 0.0163), slow: (0.0167, 0.0153, 0.0167),
             LIB: lib_cost}
    pick, retimed = run_final(final)
    assert set(retimed) == {fast, mid, slow, LIB}
    assert pick == fast  # the raw costs would have picked `mid` (0.0163)
    # A config whose launch is twice the template's (outside the host noise) keeps its own launch time.
    final[fast] = (0.0340, 0.0120, 0.0340)
    assert run_final(final)[0] == mid


def test_cpu_timings_and_gpu_times_without_the_host_counted_rank_by_their_cost():
    fast, slow = gen(16), gen(32)
    cpu = {fast: (0.50, None, None), slow: (0.40, None, None), LIB: (0.60, None, None)}
    assert run_final(cpu, rule=RULE)[0] == slow
    gpu_only = {fast: (0.0150, 0.0150, 0.0170), slow: (0.0120, 0.0120, 0.0171), LIB: (0.0300, 0.0300, 0.0280)}
    assert run_final(gpu_only)[0] == slow  # count_host off: the cost is the GPU time, as it was


def test_a_tie_within_library_margin_goes_to_the_library_kernel():
    """0.5% faster than cuBLAS in the final is within the timer's noise: the library kernel stays;
    2% faster wins; with library_margin=0 the 0.5% one wins."""
    tie, win = gen(1), gen(2)
    final = {LIB: (0.0200, 0.0200, 0.01), tie: (0.0199, 0.0199, 0.01), win: (0.0196, 0.0196, 0.01)}
    pair = {c: final[c] for c in (LIB, tie)}
    assert run_final(pair)[0] == LIB
    assert run_final(final)[0] == win
    assert run_final(pair, rule=final_rule(Settings(library_margin=0.0)))[0] == tie
    with pytest.raises(ValueError, match="library_margin"):
        Settings(library_margin=0.7)


def test_finalists_are_the_best_few_plus_the_best_library_kernel():
    gens = [gen(n) for n in range(5)]
    final = {c: (1.0 + i / 10, None, None) for i, c in enumerate(gens)}
    final[LIB] = (2.0, None, None)
    pick, retimed = run_final(final, rule=FinalRule(finalists=2, rounds=15, library_margin=0.01))
    assert retimed == [gens[0], gens[1], LIB] and pick == gens[0]


def test_budget_exhausted_and_single_finalist_skip_the_re_time():
    a, b = gen(1), gen(2)
    final = {a: (1.0, None, None), b: (1.1, None, None)}
    assert run_final(final, budget_exhausted=True) == (a, [])
    assert run_final({a: final[a]}) == (a, [])


def test_a_final_of_library_kernels_only_is_not_re_timed_at_quick_effort():
    blas = Choice("numpy_blas", None)
    final = {LIB: (0.8, None, None), blas: (0.9, None, None), gen(64): (1.5, None, None)}  # re-timed
    ranked = {LIB: 1.0, blas: 0.95, gen(64): 1.5}  # earlier; the generated kernel is third: no finalist
    quick = final_rule(Settings(effort="quick"))
    assert not quick.library_final and quick.finalists == 2
    pick, retimed = run_final(final, ranked, rule=quick)
    assert pick == blas and retimed == []  # the earlier timings rank the two library kernels
    pick, retimed = run_final(final, ranked, rule=final_rule(Settings(finalists=2)))
    assert pick == LIB and set(retimed) == {LIB, blas}  # the default re-times them
    final[gen(64)] = (0.5, None, None)
    pick, retimed = run_final(final, {**ranked, gen(64): 0.6}, rule=quick)
    assert pick == gen(64) and gen(64) in retimed  # a generated kernel at stake: re-timed as always


def test_stored_pick_stands_when_nothing_new_reached_the_final():
    a, b = gen(1), gen(2)
    records = {a: Timing(a, 1.0, "store"), b: Timing(b, 1.1, "store")}
    ranked = [Timing(a, 1.0, "final"), Timing(b, 1.1, "final")]
    no_retime = lambda cs, rounds: pytest.fail("re-timed a stored decision")  # noqa: E731
    assert final_pick(ranked, records, no_retime, RULE, stored_pick=b) == b
    records[a] = Timing(a, 1.0, "final")  # something new: the final runs
    assert final_pick(ranked, records, lambda cs, r: [1.0, 1.1], RULE, stored_pick=b) == a


def test_nothing_correct_raises_with_the_reasons():
    a, b = gen(1), gen(2)
    ranked = [Timing(a, None, "final"), Timing(b, None, "final")]
    wrong = {a: Timing(a, None, "final", "wrong_result", "max err 3.0"),
             b: Timing(b, None, "final", "run_failed", "boom")}
    with pytest.raises(NoCandidatesError, match=r"p1: no candidate produced a correct result .*max err 3.0.*boom"):
        final_pick(ranked, wrong, lambda cs, r: [], RULE, describe="p1")
    failed = {c: Timing(c, None, "compile", "compile_failed", "out of resource") for c in (a, b)}
    with pytest.raises(NoCandidatesError, match="p1: every candidate failed to compile: out of resource"):
        final_pick(ranked, failed, lambda cs, r: [], RULE, describe="p1")


# -- replay and simulate decide as tune does -----------------------------------------------------

def near_tie_shape():
    """A template 0.5% faster than the library kernel: first in the raw ranking, not the final pick."""
    return ReplayShape((64, 64, 64), {LIB: 1.0, gen(1): 0.995, gen(2): 1.2}, "tie")


def test_replay_and_simulate_apply_the_final_rule(monkeypatch):
    shape = near_tie_shape()
    calls = []
    real = steps.final_decision  # replays run tune's own pipeline, final included
    monkeypatch.setattr(steps, "final_decision", lambda *a, **kw: calls.append(1) or real(*a, **kw))

    d = decide(shape, "exhaustive", ExhaustiveOptions())
    assert d.ranked[0].choice == gen(1) and d.pick == LIB
    out = replay(shape, "exhaustive", ExhaustiveOptions())
    assert out.winner == LIB and out.regret_pct == pytest.approx(100 * (1.0 / 0.995 - 1))
    rep = simulate([shape], [StrategySpec("e", "exhaustive"),
                             StrategySpec("e0", "exhaustive", final=FinalRule(3, 15, library_margin=0.0))])
    assert rep["e"].per_shape[0].winner == "aten_mm" and rep["e"].max_regret_pct == pytest.approx(out.regret_pct)
    assert rep["e0"].per_shape[0].winner == gen(1).key and rep["e0"].max_regret_pct == 0.0
    assert len(calls) == 4  # decide, replay, and simulate's two specs all went through the pipeline's final


def test_replay_finalists_follow_the_rule():
    """Only the best `finalists` (plus the best library kernel) reach the final."""
    shape = ReplayShape((8, 8, 8), {gen(1): 1.0, gen(2): 1.001, LIB: 2.0})
    assert replay(shape, "exhaustive", ExhaustiveOptions(), FinalRule(1, 15, 0.01)).winner == gen(1)


def test_replay_of_a_shape_where_nothing_ran_raises():
    shape = ReplayShape((8, 8, 8), {}, "empty", failed=(gen(1),))
    assert decide(shape, "exhaustive", ExhaustiveOptions()).pick is None
    with pytest.raises(NoCandidatesError):
        replay(shape, "exhaustive", ExhaustiveOptions())


# -- prune: once, and only where the cost model applies ------------------------------------------------

def modelled_choices():
    cfgs = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_stages=4, num_warps=8)
            for bm in (16, 64, 128) for bn in (64, 128)]
    return [Choice("triton_mm", "h", as_params(c), as_params({"swizzle": s}), family="triton")
            for c in cfgs for s in (1, 8)] + [LIB]


def test_model_pruned_prunes_once_and_its_search_does_not_prune():
    choices = modelled_choices()
    scored = []
    model = lambda cfg, M, N, K, **kw: scored.append(cfg) or cfg["BLOCK_M"]  # noqa: E731 - small tiles first
    opts = ModelPrunedOptions(stage0_n=2, problem=ProblemDims(4096, 4096, 4096), model=model)
    strategy = STRATEGIES["model_pruned"]
    kept = strategy.prune(choices, opts)
    assert len(scored) == 6 and len({c.binary_key for c in kept if not c.is_extern}) == 2 and LIB in kept
    timed = []
    strategy.search(choices, lambda cs, st: timed.extend(cs) or [1.0] * len(cs), opts)
    assert len(scored) == 6  # search never consults the model again
    assert len({c.binary_key for c in timed if not c.is_extern}) == 6  # every binary it was handed
    scored.clear()
    strategy(choices, lambda cs, st: [1.0] * len(cs), opts)  # the one-call form: prune, then search
    assert len(scored) == 6


def test_default_options_prune_with_the_model():
    choices = modelled_choices()
    opts = default_options(ProblemDims(4096, 4096, 4096))
    assert len(STRATEGIES["model_pruned"].prune(choices, opts)) == len(choices)  # 6 binaries < stage0_n (14): all kept
    few = [Choice("triton_mm", "h", as_params(dict(BLOCK_M=16 * i, BLOCK_N=64, BLOCK_K=32, num_stages=3, num_warps=4)),
                  family="triton") for i in range(1, 30)]
    assert len(STRATEGIES["model_pruned"].prune(few, opts)) == 14


def _cpu_problem():
    import torch
    from gemmtune.core.inputs import KernelInputs

    return KernelInputs.from_tensors("mm", torch.randn(64, 32), torch.randn(32, 16))


def test_default_is_the_default_efforts_strategy_and_options_whatever_the_settings_say():
    plan = plan_for(Settings(strategy="default", top_x=7, stage0_n=3), _cpu_problem())
    assert plan.name == "default" and plan.strategy is STRATEGIES["prescreen"]  # model_pruned off CUDA
    assert type(plan.options) is PrescreenOptions and plan.options.top_x == Settings().top_x
    assert not hasattr(plan.options, "stage0_n")  # prescreen sees its own knobs only
    mine = plan_for(Settings(strategy="prescreen", top_x=7), _cpu_problem())
    assert mine.options.top_x == 7 and mine.budget.runs is None


def test_budgeted_is_default_under_the_budget_of_runs():
    plan = plan_for(Settings(strategy="budgeted", budget_runs=5, top_x=7), _cpu_problem())
    assert plan.name == "budgeted" and plan.asked == "budgeted" and plan.strategy is STRATEGIES["prescreen"]
    assert plan.budget.runs == 5 and plan.options.top_x == Settings().top_x


def test_one_launch_that_read_low_does_not_beat_kernels_faster_on_the_gpu():
    # Three Triton finalists shorter than their launch (about 20 us, one launcher); the third's launch read
    # 13.5 us once.  The first is fastest on the GPU: the lucky reading ties on the launch and loses.
    a, b, lucky = gen(16), gen(32), gen(64)
    final = {a: (0.0200, 0.0108, 0.0200), b: (0.0210, 0.0110, 0.0210), lucky: (0.0135, 0.0119, 0.0135),
             LIB: (0.0300, 0.0130, 0.0300)}
    pick, _ = run_final(final)
    assert pick == a


def test_a_launch_far_above_its_templates_median_keeps_its_own_time():
    # The same, but the GPU-fastest one's launch read 40 us, twice the others': that may be a real cost.
    a, b, c = gen(16), gen(32), gen(64)
    final = {a: (0.0400, 0.0108, 0.0400), b: (0.0200, 0.0110, 0.0200), c: (0.0210, 0.0115, 0.0210),
             LIB: (0.0500, 0.0130, 0.0500)}  # a slower library launch: `a` could still beat it
    pick, _ = run_final(final)
    assert pick == b


def test_a_float8_problem_keeps_at_least_twenty_binaries_whatever_stage0_n_says():
    few = [Choice("triton_mm", "h", as_params(dict(BLOCK_M=16 * i, BLOCK_N=64, BLOCK_K=32, num_stages=3, num_warps=4)),
                  family="triton") for i in range(1, 30)]
    prune = STRATEGIES["model_pruned"].prune
    for n, wide, narrow in ((14, 14, 20), (8, 8, 20), (25, 25, 25)):
        opts = default_options(ProblemDims(4096, 4096, 4096)).given(stage0_n=n)
        assert len(prune(few, opts)) == wide
        assert len(prune(few, opts.given(problem=ProblemDims(4096, 4096, 4096, dtype_bytes=1)))) == narrow
    assert len(prune(few, opts.given(stage0_n=None, problem=ProblemDims(8, 8, 8, dtype_bytes=1)))) == len(few)
