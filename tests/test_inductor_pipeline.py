"""A graph's new problems timed together (`inductor.pipeline`, `install(pipeline=True)`).  Inductor's
pipelined autotuning times GPU kernels in its worker process, so the whole path runs on the GPU
(tests/gpu/test_pipeline_gpu.py); here its parts run against Inductor's own config, scheduler
method, autotuner and process pool: the flags held for one graph and set back after its scheduler,
the window's patch not undoing them, the worker's timings reaching a listener and the probe, the
candidates the pipelined path cannot time, and a worker spawned from a script without a `__main__`
guard not running that script again."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

import gemmtune.inductor as gi
from gemmtune.inductor import pipeline, window

from helpers import fresh_inductor  # noqa: F401 - the fixture

pytestmark = [pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table"),
              pytest.mark.skipif(not pipeline.available(), reason="this torch has no pipelined GEMM autotuning"),
              pytest.mark.usefixtures("fresh_inductor")]


@pytest.fixture
def flags(monkeypatch):
    """Inductor's two flags at their defaults, no worker started, nothing held before or after."""
    from torch._inductor import config

    monkeypatch.setattr(pipeline, "_warm_up", lambda: None)
    pipeline.release()
    with config.patch(pipeline_max_autotune_gemm=False, benchmark_epilogue_fusion=True):
        yield config
        pipeline.release()


def _finalize(graph):
    """Inductor's scheduler finishing `graph` (the method, on a scheduler without nodes)."""
    from torch._inductor.scheduler import Scheduler
    from torch._inductor.virtualized import V

    with V.set_graph_handler(graph):
        Scheduler.finalize_multi_template_buffers(SimpleNamespace(nodes=[]))


def test_the_flags_are_held_for_one_graph_and_set_back_by_its_scheduler(flags):
    graph = object()
    with window._opened():  # a GEMM lowering in the default-mode window
        assert flags.benchmark_epilogue_fusion is False  # the window's own patch
        assert pipeline.hold(graph) and flags.pipeline_max_autotune_gemm is True
    # the window's patch ended: epilogue benchmarking stays off for the held graph
    assert (flags.pipeline_max_autotune_gemm, flags.benchmark_epilogue_fusion) == (True, False)
    _finalize(object())  # another graph's scheduler leaves them
    assert pipeline.held()
    _finalize(graph)
    assert not pipeline.held()
    assert (flags.pipeline_max_autotune_gemm, flags.benchmark_epilogue_fusion) == (False, True)


def test_a_graph_that_failed_before_scheduling_leaves_no_flags_to_a_max_autotune_compile(flags):
    with window._opened():
        pipeline.hold("failed graph")
    with window._opened():  # a default-mode compile's next graph takes the hold over
        pipeline.hold("next graph")
    _finalize("next graph")
    assert (flags.pipeline_max_autotune_gemm, flags.benchmark_epilogue_fusion) == (False, True)
    with window._opened():
        pipeline.hold("failed graph")
    with flags.patch(max_autotune=True), window._opened():  # a max-autotune compile: never pipelined
        assert not pipeline.held() and flags.pipeline_max_autotune_gemm is False
    with window._opened():
        pipeline.hold("failed again")
    gi.install()
    gi.uninstall()  # uninstall sets back what a failed compile held
    assert not pipeline.held() and (flags.pipeline_max_autotune_gemm, flags.benchmark_epilogue_fusion) == (False, True)


def test_the_handler_pipelines_a_new_problem_in_the_default_mode_window_only(flags):
    from torch._inductor.virtualized import V

    handler = gi.install(pipeline=True)
    assert handler.uuid() != gi.install().uuid()  # a pipelined compile has an FX-graph cache key of its own
    graph = object()
    plain, subgraph = _ktc(), _ktc(subgraph=True)
    with V.set_graph_handler(graph):
        assert pipeline.pipelined(handler, [plain, subgraph], False) == [plain, subgraph]  # not the window
        with window._opened():
            assert pipeline.pipelined(handler, [plain, subgraph], True) == [plain]  # decompose-k dropped
        assert handler.stats["pipelined"] == 1 and pipeline.held()
        _finalize(graph)
        handler.pipeline = False
        assert pipeline.pipelined(handler, [plain], True) == [plain] and not pipeline.held()


def _ktc(subgraph: bool = False):
    from torch._inductor.codegen.subgraph import SubgraphTemplate

    template = object.__new__(SubgraphTemplate) if subgraph else SimpleNamespace(uid="triton::mm")
    return SimpleNamespace(template=template)


class _Choice:
    """What the autotuner keys a choice by (Inductor's ChoiceCaller: `hash_key()`, `name`)."""

    def __init__(self, name: str):
        self.name = name

    def hash_key(self) -> str:
        return self.name


def test_the_workers_timings_reach_listeners_and_the_probe():
    from torch._inductor.autotune_process import AsyncAutotuner

    choices = [_Choice(f"c{i}") for i in range(3)]
    for i, c in enumerate(choices):
        done: Future = Future()
        done.set_result(0.01 * (i + 1))
        AsyncAutotuner.choice_hash_to_future[c.hash_key() + "|k"] = done
    heard: list = []

    def broken(timings):
        raise RuntimeError("a listener that fails")

    try:
        pipeline.feed(broken)  # logged, never raised into Inductor
        pipeline.feed(heard.append)
        with gi.benchmark_probe() as probe:
            timings = AsyncAutotuner.get_results(choices, "|k")
        pipeline.unfeed(heard.append)
        AsyncAutotuner.get_results(choices[:1], "|k")  # no longer heard
    finally:
        pipeline.unfeed(heard.append)
        pipeline.unfeed(broken)
        for c in choices:
            AsyncAutotuner.choice_hash_to_future.pop(c.hash_key() + "|k")
    assert heard == [timings] and sorted(timings.values()) == [0.01, 0.02, 0.03]
    assert probe.choices == 3 and probe.names == ["c0", "c1", "c2"]


def test_bad_pipeline_values_are_value_errors():
    with pytest.raises(ValueError, match="pipeline"):
        gi.install(pipeline="yes")


SCRIPT = """
import json
from torch._inductor import autotune_process
from gemmtune.inductor import pipeline
print("TOP-LEVEL RAN", flush=True)
pipeline._warm_up()
pool = autotune_process.AutotuneProcessPool.get_instance()
print(json.dumps({"started": pool._warmup_future.result(timeout=300)}), flush=True)
"""


def test_the_worker_is_spawned_without_running_a_guardless_script_again(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=400,
                          env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("TOP-LEVEL RAN") == 1, done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"started": True}
