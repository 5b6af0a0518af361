"""The second timer decides a close call: a generated pick within `second_timer_band` of the library
kernel stands only if an independent timer also has it ahead by the library margin.  The rule with
stand-in readings, then through a whole tune (its Selection, report and stored pick)."""

from __future__ import annotations

import pytest
import torch

import gemmtune
from gemmtune import engine
from gemmtune.core.choices import Choice, Timing
from gemmtune.measure.bench import Bench
from gemmtune.measure.compile import CompileResult
from gemmtune.measure.replay import ReplayRunner
from gemmtune.measure.second import second_timer_for
from gemmtune.report import autotune_table, selection_dict
from gemmtune.search.final import FinalRule, final_decision
from gemmtune.store.sqlite import Store
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate

LIB, GEN = Choice("aten_mm", None), Choice("triton_mm", "h", family="triton")


def _decide(first, second_ms, band=0.1, margin=0.01):
    """The final over a library kernel at 1.0 ms and a generated one at `first` ms; the second timer
    reads them at `second_ms` (library, generated), or is absent (None).  Returns (decision, asked)."""
    records = {LIB: Timing(LIB, 1.0, "final"), GEN: Timing(GEN, first, "final")}
    ranked = sorted(records.values(), key=lambda t: t.ms)
    asked = []

    def second(choices):
        asked.append(list(choices))
        return None if second_ms is None else ("do_bench", [{LIB: second_ms[0], GEN: second_ms[1]}[c] for c in choices])

    retime = lambda cs, rounds: [records[c].ms for c in cs]  # noqa: E731
    rule = FinalRule(finalists=2, rounds=3, library_margin=margin, second_band=band)
    return final_decision(ranked, records, retime, rule, second=second), asked


def test_a_close_call_the_second_timer_reads_the_other_way_keeps_the_library_kernel():
    d, asked = _decide(0.96, (1.0, 1.03))
    assert d.choice == LIB and asked == [[GEN, LIB]]
    assert d.second.timer == "do_bench" and not d.second.kept
    assert "library kernel kept" in d.second.describe() and "1.030x" in d.second.describe()


def test_a_close_call_the_second_timer_confirms_keeps_the_generated_kernel():
    d, _ = _decide(0.96, (1.0, 0.97))
    assert d.choice == GEN and d.second.kept


def test_a_win_inside_the_margin_under_the_second_timer_is_no_win():
    d, _ = _decide(0.96, (1.0, 0.995))  # 0.5% ahead there: within the 1% library margin
    assert d.choice == LIB


def test_a_clear_win_or_no_second_timer_needs_no_second_reading():
    d, asked = _decide(0.85, (1.0, 2.0))  # 15% ahead: outside the 10% band
    assert d.choice == GEN and d.second is None and asked == []
    d, asked = _decide(0.96, None)  # nothing could read it again: the first timer decides
    assert d.choice == GEN and d.second is None and asked == [[GEN, LIB]]
    d, asked = _decide(0.96, (1.0, 2.0), band=0.0)  # switched off
    assert d.choice == GEN and asked == []


def test_the_second_timer_differs_from_the_first():
    assert second_timer_for("read") == "do_bench" and second_timer_for("write") == "cuda_graph"


def test_a_runner_without_a_second_timer_or_a_failing_one_leaves_the_first_timers_decision(caplog):
    ki = None
    bench = Bench(ki, ReplayRunner({}), CompileResult(), describe="mm(8x8, 8x8)")
    assert bench.second_opinion([LIB, GEN]) is None

    class Failing(ReplayRunner):
        def second_opinion(self, choices):
            raise RuntimeError("CUDA error: out of memory")

    bench = Bench(ki, Failing({}), CompileResult(), describe="mm(8x8, 8x8)")
    assert bench.second_opinion([LIB, GEN]) is None
    assert "the second timer failed" in caplog.text and "mm(8x8, 8x8)" in caplog.text


class _CloseCall(ReplayRunner):
    """The generated kernel reads 4% faster under the first timer and 3% slower under the second."""

    def __init__(self):
        super().__init__({})

    def time(self, choice, stage, *, check):
        return Timing(choice, 1.0 if choice.is_extern else 0.96, stage, spread=0.001)

    def time_interleaved(self, choices, rounds):
        return [self.time(c, "finalist", check=False) for c in choices]

    def second_opinion(self, choices):
        return "do_bench", [1.0 if c.is_extern else 1.03 for c in choices]


def test_a_tune_says_which_timer_decided_in_its_selection_report_and_store(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "runner_for", lambda *a, **kw: _CloseCall())
    a, b = torch.randn(16, 12), torch.randn(12, 8)
    store = Store(tmp_path / "picks.db")
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate(n_configs=1, runtime=(1,))],
                        store=store)
    assert sel.winner.template_uid == "aten_mm" and sel.decided_by == "do_bench"
    assert "decided by a second timer: do_bench read scripted" in autotune_table(sel)
    assert selection_dict(sel)["decided_by"] == "do_bench"
    (entry,) = store.export()["entries"]
    assert entry["pick"]["strategy"].endswith("decided by do_bench")
    torch.testing.assert_close(sel(a, b), a @ b)


def test_a_gpu_win_inside_its_readings_spread_keeps_the_library_kernel_and_is_not_provisional():
    def timing(choice, ms, spread):
        return Timing(choice, ms, "finalist", gpu_ms=ms, host_ms=0.005, spread=spread)

    for spread, winner in ((0.06, LIB), (0.01, GEN)):  # 4% faster: inside a 6% spread, outside a 1% one
        records = {LIB: timing(LIB, 1.0, spread), GEN: timing(GEN, 0.96, spread)}
        retime = lambda cs, rounds: [records[c].ms for c in cs]  # noqa: E731
        d = final_decision(sorted(records.values(), key=lambda t: t.ms), records, retime,
                           FinalRule(finalists=2, rounds=3, library_margin=0.01, second_band=0.0, noise_limit=0.05))
        assert d.choice == winner and not d.provisional  # a GPU pick is never provisional for its spread
