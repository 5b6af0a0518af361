"""Subprocess benchmarking: faulty candidates never take the caller down (CPU stand-ins for GPU faults)."""

import os

import torch

import gemmtune
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate

ISOLATED = gemmtune.Settings(isolation="subprocess", run_timeout_s=8.0, store="off", strategy="exhaustive",
                             cpu_rep_ms=5, finalist_rounds=2)


def one(uid, mode):
    return ScriptedTemplate(uid, mode=mode, n_configs=1, runtime=(1,))


def test_isolated_tuning_survives_every_fault_class():
    a, b = torch.randn(40, 24), torch.randn(24, 32)
    templates = [AtenTemplate("mm"), one("crash", "crash_run"), one("segv", "segfault_run"),
                 one("hang", "hang_run"), one("raises", "raise_run"), one("wrong", "wrong"),
                 one("broken", "compile_error"), one("good", "ok")]
    sel = gemmtune.tune("mm", a, b, templates=templates, settings=ISOLATED)
    status = {t.choice.template_uid: (t.status, t.detail) for t in sel.timings}
    assert status["crash"][0] == "run_failed" and "worker died" in status["crash"][1]
    assert status["segv"][0] == "run_failed" and "worker died" in status["segv"][1]
    assert status["hang"][0] == "run_failed" and "hang" in status["hang"][1]
    assert status["raises"][0] == "run_failed" and "illegal memory access" in status["raises"][1]
    assert status["wrong"][0] == "wrong_result"
    assert status["broken"][0] == "compile_failed"
    assert status["good"][0] == "ok" and status["aten_mm"][0] == "ok"
    assert sel.winner.template_uid in ("good", "aten_mm")
    torch.testing.assert_close(sel(a, b), a @ b)
    assert os.getpid() and torch.mm(a, b).shape == (40, 32)  # this process is alive and healthy


def test_isolated_and_in_process_agree_on_a_healthy_pool():
    a, b = torch.randn(48, 16), torch.randn(16, 24)
    templates = [AtenTemplate("mm"), ScriptedTemplate("good", n_configs=2, runtime=(1, 2))]
    sel = gemmtune.tune("mm", a, b, templates=templates, settings=ISOLATED.with_(strategy="prescreen"))
    assert all(t.status in ("ok", "not_benchmarked") for t in sel.timings)
    assert sel.benchmark_runs > 0 and sel.winner_ms is not None
    torch.testing.assert_close(sel(a, b), a @ b)


def test_isolation_setting_is_validated():
    import pytest

    with pytest.raises(ValueError, match="isolation"):
        gemmtune.Settings(isolation="container")


def test_report_says_subprocess():
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate("good", n_configs=1)],
                        settings=ISOLATED)
    assert "\nSubProcess AUTOTUNE benchmarking takes" in gemmtune.autotune_table(sel)  # the summary, wrapped to the width


def test_one_worker_per_device_is_kept_and_reused_across_tunes():
    from gemmtune.measure import isolation

    templates = [AtenTemplate("mm"), ScriptedTemplate("good", n_configs=1)]
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    gemmtune.tune("mm", a, b, templates=templates, settings=ISOLATED)
    (kept,) = isolation._POOL["cpu"]
    pid = kept.proc.pid
    c, d = torch.randn(24, 8), torch.randn(8, 40)
    sel = gemmtune.tune("mm", c, d, templates=templates, settings=ISOLATED)
    torch.testing.assert_close(sel(c, d), c @ d)
    assert [w.proc.pid for w in isolation._POOL["cpu"]] == [pid]  # same process, new problem
    assert kept._setup is None  # the kept worker holds no reference to the caller's tensors
    kept.proc.kill()  # a kept worker that died while idle is replaced on the next tune
    kept.proc.wait()
    sel = gemmtune.tune("mm", a, b, templates=templates, settings=ISOLATED)
    assert sel.winner_ms is not None and isolation._POOL["cpu"][0].proc.pid != pid
    isolation.shutdown_workers()
    assert not isolation._POOL


def test_auto_isolation_isolates_gpus_and_measures_cpu_in_process():
    from gemmtune.core.settings import isolation_for

    assert gemmtune.Settings().isolation == "auto"
    assert isolation_for("auto", "cuda") == "subprocess" and isolation_for("auto", "cpu") == "off"
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate("good", n_configs=1)],
                        settings=gemmtune.Settings(store="off", cpu_rep_ms=5))
    assert sel.isolation == "off"


def test_unpicklable_templates_fall_back_in_process_under_auto_but_not_when_asked(monkeypatch):
    import pytest

    from gemmtune.pipeline import plan

    class Local(ScriptedTemplate):  # defined in a function: cannot be pickled to a worker
        pass

    a, b = torch.randn(16, 8), torch.randn(8, 12)
    templates = [AtenTemplate("mm"), Local("local", n_configs=1)]
    with pytest.raises(gemmtune.IsolationUnavailable, match="cannot be sent to a worker"):
        gemmtune.tune("mm", a, b, templates=templates, settings=ISOLATED)
    # "auto" on a GPU would isolate: here it warns and measures in this process instead.
    monkeypatch.setattr(plan, "isolation_for", lambda mode, device_type: "subprocess")
    sel = gemmtune.tune("mm", a, b, templates=templates, settings=ISOLATED.with_(isolation="auto"))
    assert sel.isolation == "off" and sel.winner_ms is not None
    torch.testing.assert_close(sel(a, b), a @ b)


def test_a_worker_started_in_the_background_is_the_one_the_first_tune_takes():
    from gemmtune.measure import isolation

    isolation.shutdown_workers()
    cancel = isolation.prestart("cpu", 60.0)
    assert isolation.prestart("cpu", 60.0)() is None  # a second start while one is under way: nothing
    starting = isolation._STARTING["cpu"]
    templates = [AtenTemplate("mm"), ScriptedTemplate("good", n_configs=1)]
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    sel = gemmtune.tune("mm", a, b, templates=templates, settings=ISOLATED)
    assert sel.isolation == "subprocess" and "cpu" not in isolation._STARTING
    (kept,) = isolation._POOL["cpu"]
    assert kept is starting.result()  # the tune took the started worker, and it is kept after
    cancel()  # taken: cancelling does not stop it
    assert kept.alive
    isolation.shutdown_workers()


def test_a_background_start_nobody_took_is_stopped_by_cancel():
    from gemmtune.measure import isolation

    isolation.shutdown_workers()
    cancel = isolation.prestart("cpu", 60.0)
    starting = isolation._STARTING["cpu"]
    cancel()
    worker = starting.result(timeout=120)
    worker.proc.wait(timeout=30)  # closed once its start finished
    assert not worker.alive and "cpu" not in isolation._STARTING and not isolation._POOL.get("cpu")
