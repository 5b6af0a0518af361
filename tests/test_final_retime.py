"""A pick comes from a final in which it was re-timed against the library kernel: a lone stage-1
time (a cheap run that read 10x fast on a loaded CPU) never becomes a settled pick."""

from __future__ import annotations

import torch

import gemmtune
from gemmtune import engine
from gemmtune.measure.bench import Bench
from gemmtune.measure.compile import CompileResult
from gemmtune.measure.replay import ReplayRunner
from gemmtune.core.choices import Choice, Timing
from gemmtune.core.inputs import KernelInputs
from gemmtune.search.final import FinalRule, final_decision
from gemmtune.store.sqlite import Store
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate

LIB, GEN = Choice("aten_mm", None), Choice("numba_mm", "h", family="numba")


class LoadedMachine(ReplayRunner):
    """Separate timings as on a loaded CPU (the generated kernel's one cheap run read fast, the library
    kernel's 50x slow); the interleaved re-time gives the true times: the library kernel is 4x faster."""

    def __init__(self) -> None:
        super().__init__({})
        self.interleaved: list[list[str]] = []

    def time(self, choice, stage, *, check):
        self.asked.append(choice)
        return Timing(choice, 7.6 if choice.is_extern else 0.5, stage, spread=0.05)

    def time_interleaved(self, choices, rounds):
        self.interleaved.append([c.template_uid for c in choices])
        return [Timing(c, 0.16 if c.is_extern else 0.6, "finalist", spread=0.05) for c in choices]


def test_a_generated_kernel_alone_within_reach_is_re_timed_against_the_library_kernel(monkeypatch):
    runner = LoadedMachine()
    monkeypatch.setattr(engine, "runner_for", lambda *a, **kw: runner)
    a, b = torch.randn(24, 16), torch.randn(16, 20)
    store = Store(":memory:")
    settings = gemmtune.Settings(isolation="off", strategy="exhaustive", cpu_rep_ms=1.0)
    templates = [AtenTemplate("mm"), ScriptedTemplate(n_configs=1, runtime=(1,))]
    sel = gemmtune.tune("mm", a, b, templates=templates, settings=settings, store=store)
    assert runner.interleaved == [["scripted", "aten_mm"]]
    assert sel.winner == Choice("aten_mm", None) and not sel.provisional
    assert {t.choice.template_uid: (t.ms, t.stage) for t in sel.timings} == {
        "aten_mm": (0.16, "finalist"), "scripted": (0.6, "finalist")}
    assert store.problems()[0]["template"] == "aten_mm"


def _ki() -> KernelInputs:
    return KernelInputs.from_tensors("mm", torch.randn(8, 8), torch.randn(8, 8))


def test_the_cpu_re_time_adds_the_library_kernel_only_for_a_generated_contender():
    runner = ReplayRunner({LIB.key: 3.0, GEN.key: 1.0})
    bench = Bench(_ki(), runner, CompileResult(), runnable=2)
    bench.measure([LIB, GEN], "final")
    runner.asked.clear()
    assert bench.retime([GEN, LIB], rounds=3) == [1.0, 3.0] and runner.asked == [GEN, LIB]
    assert bench.records[LIB].stage == bench.records[GEN].stage == "finalist"
    numpy = Choice("numpy_blas", None, family="numpy")
    runner = ReplayRunner({LIB.key: 1.0, numpy.key: 3.0})
    bench = Bench(_ki(), runner, CompileResult(), runnable=2)
    bench.measure([LIB, numpy], "final")
    runner.asked.clear()
    assert bench.retime([LIB, numpy], rounds=3) == [1.0, 3.0] and runner.asked == []  # a clear library win


def test_a_pick_not_re_timed_with_the_library_kernel_is_provisional():
    records = {LIB: Timing(LIB, 7.6, "final"), GEN: Timing(GEN, 0.5, "prescreen")}
    ranked = [Timing(GEN, 0.5, "prescreen"), Timing(LIB, 7.6, "final")]
    rule = FinalRule(3, 15, 0.01)
    d = final_decision(ranked, records, lambda cs, r: [records[c].ms for c in cs], rule, budget_exhausted=True)
    assert d.choice == GEN and d.provisional  # the budget ran out before the re-time: not settled
    d = final_decision(ranked, records, lambda cs, r: [records[c].ms for c in cs], rule)
    assert d.choice == GEN and d.provisional  # a re-time that timed nothing leaves it unconfirmed

    def retime(cs, rounds):
        for c, ms in zip(cs, (0.6, 0.16) if cs[0] == GEN else (0.16, 0.6)):
            records[c] = Timing(c, ms, "finalist")
        return [records[c].ms for c in cs]

    d = final_decision(ranked, records, retime, rule)
    assert d.choice == LIB and not d.provisional


def _final(times: dict, spread: float):
    """final_decision over finalists with these interleaved times, all with this spread."""
    records = {c: Timing(c, ms, "final") for c, ms in times.items()}

    def retime(cs, rounds):
        for c in cs:
            records[c] = Timing(c, times[c], "finalist", spread=spread)
        return [times[c] for c in cs]

    ranked = [Timing(c, times[c], "final") for c in sorted(times, key=times.get)]
    return final_decision(ranked, records, retime, FinalRule(3, 15, 0.01, noise_limit=0.25))


def test_heavy_noise_unsettles_a_close_call_only():
    clear = _final({LIB: 1.0, GEN: 2.0}, spread=0.3)  # spread above the limit, but a 2x gap
    assert clear.choice == LIB and not clear.noisy and not clear.provisional
    close = _final({LIB: 1.0, GEN: 0.9}, spread=0.3)  # a 10% "win" inside 30% noise
    assert close.choice == LIB and close.noisy and close.provisional
    quiet = _final({LIB: 1.0, GEN: 0.9}, spread=0.02)
    assert quiet.choice == GEN and not quiet.noisy and not quiet.provisional


BLAS = Choice("numpy_blas", None, family="numpy")


def test_numpy_blas_is_held_to_the_rules_of_a_generated_kernel_against_torchs_op():
    tie = _final({LIB: 0.1748, BLAS: 0.1740}, spread=0.002)  # 0.5% faster: inside the library margin
    assert tie.choice == LIB and not tie.provisional
    win = _final({LIB: 0.20, BLAS: 0.15}, spread=0.002)
    assert win.choice == BLAS and not win.provisional
    runner = ReplayRunner({LIB.key: 8.0, BLAS.key: 0.2})  # torch.mm's separate timing read a tick slow
    bench = Bench(_ki(), runner, CompileResult(), runnable=2)
    bench.measure([LIB, BLAS], "final")
    runner.asked.clear()
    bench.retime([BLAS, LIB], rounds=3)
    assert runner.asked == [BLAS, LIB]  # re-timed against torch's op, not let through as "a library kernel"
