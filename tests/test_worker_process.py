"""The isolation worker is a fresh interpreter (`python -m gemmtune.measure.worker`): it never imports
the caller's `__main__`, so a plain script, `python -c`, `python -m` and a notebook-style session
(code read from stdin) can all tune with isolation."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gemmtune
from gemmtune.templates.extern import AtenTemplate

from helpers import ScriptedTemplate

# No `if __name__ == "__main__":` guard: a multiprocessing spawn would re-import this module in the worker.
SCRIPT = textwrap.dedent("""\
    import torch, gemmtune
    torch.manual_seed(0)
    a, b = torch.randn(40, 24), torch.randn(24, 32)
    sel = gemmtune.tune("mm", a, b, settings=gemmtune.Settings(isolation="subprocess", store="off", cpu_rep_ms=5))
    assert sel.isolation == "subprocess", sel.isolation
    # float32 tolerance: a numba winner (under load it can win) sums K in another order than torch.mm
    print("RESULT", sel.isolation, bool(torch.allclose(sel(a, b), a @ b, rtol=1e-4, atol=1e-5)), sel.winner_ms is not None)
    """)


def _env():
    src = str(Path(gemmtune.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}


@pytest.mark.parametrize("how", ["script", "-c", "-m", "stdin"])
def test_isolated_tune_works_from_a_script_without_a_main_guard(tmp_path, how):
    script = tmp_path / "plain_tune.py"
    script.write_text(SCRIPT)
    args, stdin = {"script": ([str(script)], None), "-c": (["-c", SCRIPT], None),
                   "-m": (["-m", "plain_tune"], None), "stdin": (["-"], SCRIPT)}[how]
    done = subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT subprocess True True" in done.stdout, (done.stdout, done.stderr[-3000:])
    assert "WorkerLost" not in done.stderr


def test_templates_defined_in_main_cannot_be_isolated_and_say_why(monkeypatch):
    main = sys.modules["__main__"]
    Mine = type("MainTemplate", (ScriptedTemplate,), {"__module__": "__main__"})
    # Plain pickle finds it in __main__; a worker, which never imports __main__, would not.
    monkeypatch.setattr(main, "MainTemplate", Mine, raising=False)
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    settings = gemmtune.Settings(isolation="subprocess", store="off", cpu_rep_ms=5)
    with pytest.raises(gemmtune.IsolationUnavailable, match="__main__"):
        gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), Mine("mine", n_configs=1)], settings=settings)


def test_worker_setup_error_is_isolation_unavailable_and_the_worker_is_kept(monkeypatch):
    """A problem the worker cannot load (here: a template module it cannot import) is not a crash."""
    from gemmtune.measure import isolation

    Ghost = type("Ghost", (ScriptedTemplate,), {"__module__": "gemmtune_no_such_module"})
    fake = type(sys)("gemmtune_no_such_module")
    fake.Ghost = Ghost
    monkeypatch.setitem(sys.modules, "gemmtune_no_such_module", fake)  # importable here, not in the worker
    a, b = torch.randn(16, 8), torch.randn(8, 12)
    settings = gemmtune.Settings(isolation="subprocess", store="off", cpu_rep_ms=5)
    with pytest.raises(gemmtune.IsolationUnavailable, match="cannot set up"):
        gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), Ghost("ghost", n_configs=1)], settings=settings)
    (kept,) = isolation._POOL["cpu"]
    assert kept.alive
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm")], settings=settings)
    assert sel.isolation == "subprocess" and [w.proc.pid for w in isolation._POOL["cpu"]] == [kept.proc.pid]


def test_the_worker_imports_no_public_api_layer():
    """The worker's environment makes `import gemmtune` skip the dispatch layer (torch.compile's machinery):
    a worker start costs the torch import and little more."""
    from gemmtune.measure.process import _worker_env

    env = {**_env(), **{k: v for k, v in _worker_env("cpu").items() if k == "GEMMTUNE_WORKER_PROCESS"}}
    code = ("import sys, gemmtune.measure.worker, gemmtune.measure.jobs, gemmtune.templates; "
            "print(sorted(m for m in ('gemmtune.dispatch', 'gemmtune.engine', 'torch._dynamo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    normal = subprocess.run([sys.executable, "-c", "import gemmtune; print(callable(gemmtune.mm))"], env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert normal.stdout.strip() == "True", normal.stderr


def test_a_worker_whose_caller_is_gone_exits_quietly(tmp_path):
    """A cancelled background start (a warm-up served from the store) leaves a worker that finds the
    caller's address gone: it exits without a traceback on the user's terminal."""
    import json

    hello = {"authkey": "00" * 16, "path": [], "address": str(tmp_path / "gone.sock")}
    done = subprocess.run([sys.executable, "-m", "gemmtune.measure.worker"], input=json.dumps(hello) + "\n",
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
