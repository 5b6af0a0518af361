"""cutlass_hopper compiles in compile processes (templates/cutlass/parallel.py).

Everywhere: jobs are dealt out, a process that cannot compile answers for each of its jobs (the
caller then compiles them itself), and too few jobs start nothing.  Where nvidia-cutlass-dsl is
installed: real compiles for sm_90a on CPU in two processes, then `build` loads each from disk."""

from __future__ import annotations

import os
import time

import pytest
import torch

from gemmtune.templates.cutlass import parallel


def _jobs(tmp_path, n):
    return [{"path": str(tmp_path / f"k{i}.o"), "cfg": {}, "dtype": "bfloat16", "has_bias": False, "device": "cpu",
             "arch": "sm_90a", "max_clusters": 1, "out": [8, 8], "operands": [[[8, 8], [8, 1]], [[8, 8], [8, 1]]]}
            for i in range(n)]


def test_too_few_jobs_start_no_process(tmp_path):
    jobs = _jobs(tmp_path, parallel.MIN_BATCH - 1)
    assert parallel.start(jobs, processes=2) == 0
    assert parallel.start(_jobs(tmp_path / "one", parallel.MIN_BATCH), processes=1) == 0
    assert parallel.wait(jobs[0]["path"]) == "not pending"


def test_a_job_no_process_answers_in_time_is_given_back_to_the_caller(tmp_path, monkeypatch):
    from concurrent.futures import Future

    path = str(tmp_path / "silent.o")
    monkeypatch.setitem(parallel._PENDING, path, Future())  # handed to a process that never answers
    assert parallel.wait(path, timeout_s=0.05) == "no answer within 0.05 s"


def test_every_job_of_a_failing_process_is_answered(tmp_path):
    """A compile process whose jobs fail (here: configs it cannot build) answers each with why; none hangs."""
    jobs = _jobs(tmp_path, 4)
    assert parallel.start(jobs, processes=2, min_batch=3) == 4
    assert parallel.start(jobs, processes=2, min_batch=3) == 0  # already pending: not handed out twice
    answers = [parallel.wait(j["path"], timeout_s=300) for j in jobs]
    assert all(isinstance(a, str) and a for a in answers), answers
    assert not any((tmp_path / f"k{i}.o").exists() for i in range(4))


def test_compile_processes_build_kernels_that_build_then_loads(tmp_path, monkeypatch):
    pytest.importorskip("cutlass.cute")
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from gemmtune.core.inputs import KernelInputs
    from gemmtune.templates.cutlass import hopper_kernel
    from gemmtune.templates.cutlass.hopper import kernel_src_hash

    configs = [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, stages=s, cluster_m=1, cluster_n=1) for s in (3, 4, 5)]
    a, b = torch.randn(96, 64, dtype=torch.bfloat16), torch.randn(64, 80, dtype=torch.bfloat16)
    ki, src = KernelInputs.from_tensors("mm", a, b), kernel_src_hash()
    jobs = [hopper_kernel.job_for(c, torch.bfloat16, "n", False, (a, b), ki, src) for c in configs]
    assert parallel.start(jobs, env=hopper_kernel.compile_env("sm_90a"), processes=2, min_batch=3) == 3
    assert [parallel.wait(j["path"], timeout_s=600) for j in jobs] == [None, None, None]
    t0 = time.perf_counter()
    for c in configs:
        hopper_kernel.build(c, torch.bfloat16, "n", False, (a, b), ki, src_hash=src)
    assert time.perf_counter() - t0 < 1.0  # three loads, no compile
    assert len(os.listdir(tmp_path / "cutedsl_kernels")) == 3
    assert hopper_kernel.job_for(configs[0], torch.bfloat16, "n", False, (a, b), ki, src) is None  # built here
