"""A torch.distributed job tunes each problem once and every rank runs the same pick: 4 ranks with
gloo on CPU, under torchrun (store/distributed.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from redis_server import free_port

CHILD = Path(__file__).with_name("distributed_child.py")
RANKS = 4


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {**os.environ, "GEMMTUNE_STORE": "memory", "GEMMTUNE_CACHE_DIR": str(tmp_path / "cache"),
           "GEMMTUNE_NOISE_LIMIT": "1e9", "OMP_NUM_THREADS": "1", **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1] / "src"), env.get("PYTHONPATH", "")])
    return env


def _results(out: Path) -> dict[int, dict]:
    """What each rank wrote (rank<N>.json in `out`)."""
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return {r["rank"]: r["result"] for r in rows}


def _out(tmp_path: Path, mode: str) -> Path:
    out = tmp_path / f"out-{mode}"
    out.mkdir()
    return out


def _torchrun(mode: str, tmp_path: Path) -> dict[int, dict]:
    out = _out(tmp_path, mode)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
           str(CHILD), mode, str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(out)
    assert sorted(results) == list(range(RANKS)), done.stdout[-2000:]
    return results


def _agree_and_tuned_once(results: dict[int, dict]) -> None:
    problems = next(iter(results.values())).keys()
    assert all(r.keys() == problems for r in results.values())
    for p in problems:
        assert len({r[p][0] for r in results.values()}) == 1, p  # the same pick on every rank
        assert sum(not r[p][1] for r in results.values()) == 1, p  # tuned on one rank; a store hit on the others


def test_spmd_tunes_each_problem_once_in_the_job(tmp_path):
    results = _torchrun("spmd", tmp_path)
    assert len(results[0]) == 8
    _agree_and_tuned_once(results)


def test_warmup_deals_the_problems_across_the_ranks(tmp_path):
    results = _torchrun("dealt", tmp_path)
    assert len(results[0]) == 8
    _agree_and_tuned_once(results)
    assert all(sum(not v[1] for v in r.values()) == 2 for r in results.values())  # 8 problems, 2 per rank


def test_a_range_warmup_deals_every_bucket_and_then_no_batch_size_tunes(tmp_path):
    results = _torchrun("ranged", tmp_path)
    rows = {rank: r["rows"] for rank, r in results.items()}
    assert len(rows[0]) >= 10  # 2 layers at buckets 1, 2, 4, 8, 16
    _agree_and_tuned_once(rows)
    assert all(r["untuned"] for r in results.values())  # batch 1, 3, 9, 16 ran on every rank, none tuned


def test_a_given_group_tunes_each_problem_once_within_itself(tmp_path):
    """`group=` to tune and warmup: ranks {0, 1} and {2, 3} each tune every problem once, apart."""
    results = _torchrun("groups", tmp_path)
    for pair in ({0: results[0], 1: results[1]}, {2: results[2], 3: results[3]}):
        _agree_and_tuned_once({r: v["tune"] for r, v in pair.items()})
        _agree_and_tuned_once({r: v["warmup"] for r, v in pair.items()})
        assert all(sum(not hit for _, hit in v["warmup"].values()) == 2 for v in pair.values())  # 4 problems, 2 each
    for kind in ("tune", "warmup"):  # the pairs share nothing: each tuned every problem itself
        tuned = [sum(not results[r][kind][p][1] for r in range(RANKS)) for p in results[0][kind]]
        assert len(tuned) == 4 and set(tuned) == {2}, (kind, tuned)
    assert all(not hit for r in results.values() for _, hit in r["off"].values())  # distributed="off" wins
    assert all("expected a torch.distributed ProcessGroup" in r["refused"] and "str" in r["refused"]
               for r in results.values())


def test_a_rank_that_dies_gives_every_other_rank_a_clear_error(tmp_path):
    """Started by hand, not by torchrun (whose agent would kill the other ranks itself)."""
    env = _env(tmp_path, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(RANKS),
               GEMMTUNE_DISTRIBUTED_TIMEOUT_S="10")
    out = _out(tmp_path, "dies")
    procs = [subprocess.Popen([sys.executable, str(CHILD), "dies", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(RANKS)]
    try:
        errs = [p.communicate(timeout=300)[1] for p in procs]  # a hang fails here
    finally:
        for p in procs:
            p.kill()
    results = _results(out)
    assert sorted(results) == [0, 1, 3], {r: (procs[r].returncode, errs[r][-1500:]) for r in (0, 1, 3) if r not in results}
    for rank, r in results.items():
        assert r["error"] == "DistributedTuneError", (rank, r)
        assert "rank" in r["message"] and "died" in r["message"]


@pytest.mark.parametrize("mode", ["off"])
def test_distributed_off_tunes_on_every_rank(tmp_path, mode):
    env = _env(tmp_path, GEMMTUNE_DISTRIBUTED=mode)
    out = _out(tmp_path, "off")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(CHILD), "spmd",
           str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(out)
    assert all(not hit for r in results.values() for _, hit in r.values())  # every rank tuned every problem


@pytest.mark.parametrize("group", ["world", -100, object()])
def test_a_group_that_is_not_a_process_group_is_a_type_error(group):
    import torch

    import gemmtune

    a, b = torch.randn(8, 4), torch.randn(4, 2)
    with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup"):
        gemmtune.tune("mm", a, b, backends=("extern",), group=group)
    with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup"):
        gemmtune.warmup(torch.nn.Linear(4, 2), a, backends=("extern",), progress=False, group=group)
    with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup"):
        with gemmtune.distributed_group(group):
            pass
