"""CUTLASS compile processes (templates/cutlass/parallel.py): jobs are dealt out, a process that cannot
compile answers for each of its jobs (the caller then compiles them itself), and too few jobs start
nothing.  Real compiles in compile processes, then loads from disk, run on the H200 in
tests/gpu/test_cutlass_operators_gpu.py."""

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
