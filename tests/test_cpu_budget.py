"""`budget_s` on CPU: a tune returns within 20% of its budget, whether the time goes to slow runs or
slow compiles; the quick effort times less than the default."""

import time

import pytest
import torch

import gemmtune
from gemmtune.pipeline.plan import fit_budget
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate


class SleepyTemplate(ScriptedTemplate):
    """Correct results, each run `run_s` long (a slow generated kernel)."""

    def __init__(self, run_s=0.02, **kw):
        super().__init__(**kw)
        self.run_s = run_s

    def compile(self, choice, ki, example):
        inner = super().compile(choice, ki, example)
        run_s = self.run_s

        def launch(tensors, out=None, group=1):
            time.sleep(run_s)
            return inner(tensors, out, group)

        return launch


def _tune(template, budget_s, **settings):
    a, b = torch.randn(32, 16), torch.randn(16, 24)
    s = gemmtune.Settings(isolation="off", store="off", strategy="exhaustive", budget_s=budget_s, **settings)
    t0 = time.perf_counter()
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), template], settings=s)
    return sel, time.perf_counter() - t0


@pytest.mark.parametrize("budget_s", [0.5, 1.0])
def test_slow_runs_stop_within_the_budget(budget_s):
    sel, took = _tune(SleepyTemplate(n_configs=10, runtime=(1, 2, 3)), budget_s)
    assert sel.budget_exhausted and took <= budget_s * 1.2, took
    assert sel.winner is not None and sel.benchmark_runs >= 1


def test_a_slow_compile_is_cut_at_the_budget():
    sel, took = _tune(ScriptedTemplate(mode="slow_compile", sleep_s=3.0), 0.8, compile_workers=1)
    assert sel.winner.is_extern and took <= 0.8 * 1.2, took


def test_the_cpu_timing_budget_fits_the_time_budget():
    assert fit_budget(gemmtune.Settings(budget_s=0.5)).cpu_rep_ms == 10.0
    assert fit_budget(gemmtune.Settings(budget_s=60.0)).cpu_rep_ms == 50.0


def test_quick_times_less_than_the_default():
    quick, default = (gemmtune.Settings().with_(effort=e) for e in ("quick", "default"))
    assert quick.cpu_rep_ms < default.cpu_rep_ms and quick.finalist_rounds < default.finalist_rounds
    assert quick.cpu_configs < default.cpu_configs  # fewer numba tiles compiled, checked and timed


def test_quick_times_fewer_numba_tiles_than_the_default():
    from gemmtune.store.sqlite import Store

    a, b = torch.randn(256, 256), torch.randn(256, 256)  # big enough for the first four tiles to differ
    tiles = {}
    for effort in ("quick", "default"):
        s = gemmtune.Settings(isolation="off", store="off", cpu_rep_ms=1.0).with_(effort=effort)
        sel = gemmtune.tune("mm", a, b, settings=s, store=Store(":memory:"))
        tiles[effort] = {t.choice.binary_key for t in sel.timings if t.choice.template_uid == "numba_mm" and t.ms}
    assert len(tiles["quick"]) == 2 and len(tiles["default"]) == 4


def test_a_suite_shows_which_shape_it_is_on(tmp_path, capsys):
    import json

    from gemmtune.cli import main

    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"shapes": [{"name": "a", "M": 16, "N": 8, "K": 8},
                                            {"name": "b", "M": 8, "N": 16, "K": 8}]}))
    assert main(["tune", "--device", "cpu", "--store", "off", "--backends", "extern", "--suite", str(suite)]) == 0
    err = capsys.readouterr().err
    assert "[1/2] a" in err and "[2/2] b" in err
