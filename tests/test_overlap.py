"""Timing binaries while others still compile (Settings.overlap_compile, compile.CompileJob).

On CPU "auto" never overlaps (the compile threads would share cores with the timed kernels), so
these tests ask for it with overlap_compile="on"; the compile stand-ins sleep, they do not compute.
"""

import time

import pytest
import torch

import gemmtune
from gemmtune.measure.compile import CompileJob
from gemmtune.measure.compile import overlap_for
from gemmtune.core.errors import NoCandidatesError
from gemmtune.core.inputs import KernelInputs
from gemmtune.store.sqlite import Store
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate


class UnevenTemplate(ScriptedTemplate):
    """TILE=8 compiles at once; TILE=16 takes `sleep_s` (or fails, with mode="late_error"), or with a
    `gate` (a threading.Event) waits until it is set (`sleep_s` at most)."""

    gate = None

    def compile(self, choice, ki, example):
        if choice.config_dict["TILE"] == 16:
            if self.gate is None:
                time.sleep(self.sleep_s)
            else:
                self.gate.wait(self.sleep_s)
            if self.mode == "late_error":
                raise RuntimeError("out of resource: registers")
        return ScriptedTemplate.compile(self.with_mode("ok"), choice, ki, example)

    def with_mode(self, mode):
        t = ScriptedTemplate(self.uid, mode, self.n_configs)
        return t


def mats():
    g = torch.Generator().manual_seed(0)
    return torch.randn(48, 32, generator=g), torch.randn(32, 40, generator=g)


def tune(template, listen=None, **settings):
    events = []

    def listener(event, **info):
        events.append((time.perf_counter(), event, info))
        if listen is not None:
            listen(event, info)

    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), template], strategy="exhaustive",
                        store=Store(":memory:"), listener=listener,
                        settings=gemmtune.Settings(isolation="off", store="off", cpu_rep_ms=1.0, **settings))
    return sel, events


def test_ready_binaries_are_timed_while_a_slow_one_still_compiles():
    import threading

    slow = UnevenTemplate("uneven", sleep_s=60.0)
    slow.gate = threading.Event()  # the slow binary is built only once a fast one was timed (60 s at most)
    fast = lambda event, info: event == "benchmark" and info["choice"].config_dict.get("TILE") == 8  # noqa: E731
    sel, events = tune(slow, listen=lambda event, info: fast(event, info) and slow.gate.set(),
                       overlap_compile="on")
    all_compiled = next(t for t, e, i in events if e == "compile" and i["done"] == i["total"])
    fast_timed = [t for t, e, i in events if fast(e, i)]
    assert fast_timed and min(fast_timed) < all_compiled  # timed before the slow binary was ready
    assert all(t.status == "ok" for t in sel.timings)  # the slow binary was waited for, then timed
    assert {t.choice.config_dict["TILE"] for t in sel.timings if not t.choice.is_extern} == {8, 16}


def test_without_overlap_nothing_is_timed_before_every_binary_is_built():
    sel, events = tune(UnevenTemplate("uneven", sleep_s=0.5), overlap_compile="off")
    all_compiled = next(t for t, e, i in events if e == "compile" and i["done"] == i["total"])
    assert all(t > all_compiled for t, e, i in events if e == "benchmark")


def test_a_binary_failing_after_timing_began_is_reported_and_skipped():
    sel, _ = tune(UnevenTemplate("uneven", mode="late_error", sleep_s=0.3), overlap_compile="on")
    status = {t.choice.config_dict.get("TILE"): (t.status, t.detail) for t in sel.timings if not t.choice.is_extern}
    assert status[16][0] == "compile_failed" and "registers" in status[16][1]
    assert status[8][0] == "ok" and sel.winner.config_dict.get("TILE") != 16


def test_every_binary_failing_while_overlapped_is_the_compile_error():
    with pytest.raises(NoCandidatesError, match="every candidate failed to compile"):
        gemmtune.tune("mm", *mats(), templates=[ScriptedTemplate(mode="compile_error")],
                      settings=gemmtune.Settings(isolation="off", store="off", overlap_compile="on"))


def test_compile_timeout_while_overlapped_drops_only_that_binary():
    sel, _ = tune(UnevenTemplate("uneven", sleep_s=3.0), overlap_compile="on", compile_timeout_s=0.5)
    status = {t.choice.config_dict.get("TILE"): (t.status, t.detail) for t in sel.timings if not t.choice.is_extern}
    assert status[16][0] == "compile_failed" and "TimeoutError" in status[16][1]
    assert sel.tuning_s < 2.5


def test_budget_cut_while_overlapped_is_not_stored_as_a_compile_failure():
    store = Store(":memory:")
    settings = gemmtune.Settings(isolation="off", cpu_rep_ms=1.0, overlap_compile="on", budget_s=0.6)
    sel = gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), UnevenTemplate("uneven", sleep_s=2.0)],
                        strategy="exhaustive", store=store, settings=settings)
    assert sel.budget_exhausted
    rows = [r for r in store.load(*_key(store, sel)).rows]
    assert not any(r.status == "compile_failed" for r in rows)  # a later tune compiles it again


def _key(store, sel):
    from gemmtune.store.sqlite import env_info, env_key

    return env_key(env_info(sel.problem.device)), f"{sel.problem.problem_key}|out=row"


def test_compile_job_reports_readiness_and_finishes():
    ki = KernelInputs.from_tensors("mm", *mats())
    t = UnevenTemplate("uneven", sleep_s=0.4)
    choices = gemmtune.templates.heuristics.get_template_configs(ki, [t], "mm")
    fast = next(c for c in choices if c.config_dict["TILE"] == 8)
    slow = next(c for c in choices if c.config_dict["TILE"] == 16)
    job = CompileJob(choices, {t.uid: t}, ki, mats(), timeout_s=10.0, workers=2)
    job.wait_any([fast])
    assert job.ready(fast) and job.may_run(slow)
    assert job.finish() is job and job.ready(slow) and job.launcher(slow) is not None and job.seconds > 0.3


def test_overlap_setting_is_validated_and_auto_means_isolated_gpu_only():
    with pytest.raises(ValueError, match="overlap_compile"):
        gemmtune.Settings(overlap_compile="yes")
    assert overlap_for("auto", "subprocess", "cuda") and not overlap_for("auto", "off", "cuda")
    assert not overlap_for("auto", "off", "cpu") and not overlap_for("off", "subprocess", "cuda")


def test_the_report_says_when_precompiling_overlapped_timing():
    sel, _ = tune(UnevenTemplate("uneven", sleep_s=0.5), overlap_compile="on")
    unwrapped = " ".join(gemmtune.autotune_table(sel).split())  # the table's lines are wrapped to the width
    assert sel.overlapped and "precompiling (overlapping prescreening)" in unwrapped
    plain, _ = tune(UnevenTemplate("uneven", sleep_s=0.0), overlap_compile="off")
    assert not plain.overlapped and "overlapping" not in gemmtune.autotune_table(plain)


def test_library_kernels_are_built_in_the_callers_thread_and_a_failure_is_recorded(monkeypatch):
    import threading

    from gemmtune.core.choices import Choice
    from gemmtune.measure import compile as compile_mod

    a, b = mats()
    ki = KernelInputs.from_tensors("mm", a, b)
    built_in, pools = [], []
    real_pool = compile_mod.ThreadPoolExecutor
    monkeypatch.setattr(compile_mod, "ThreadPoolExecutor", lambda **kw: pools.append(kw) or real_pool(**kw))

    class Counted(AtenTemplate):
        def compile(self, choice, ki, example):
            built_in.append(threading.current_thread().name)
            return AtenTemplate.compile(self, choice, ki, example)

    class Broken(AtenTemplate):
        uid = "aten_broken"

        def compile(self, choice, ki, example):
            raise RuntimeError("no such op")

    lib, broken = Choice("aten_mm", None), Choice("aten_broken", None)
    done = []
    job = CompileJob([lib, broken], {"aten_mm": Counted("mm"), "aten_broken": Broken("mm")}, ki, (a, b),
                     timeout_s=5.0, on_done=lambda n, total: done.append((n, total))).finish()
    assert pools == [] and built_in == [threading.current_thread().name] and done == [(1, 2), (2, 2)]
    torch.testing.assert_close(job.launcher(lib)((a, b), None), a @ b)
    assert job.launcher(broken) is None and job.failures[broken.binary_key].startswith("RuntimeError: no such op")
    generated = ScriptedTemplate("scripted", "ok", 1)
    CompileJob(generated.configs(ki), {"scripted": generated}, ki, (a, b), timeout_s=5.0).finish()
    assert len(pools) == 1  # a generated kernel compiles in the pool, as before
