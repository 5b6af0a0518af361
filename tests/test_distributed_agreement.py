"""Ranks that share a tune agree on what they tune, and check what another rank sends them
(store/distributed.py, store/rank_messages.py): 2 real gloo ranks on CPU, started by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemmtune.core.choices import Choice
from gemmtune.store.keys import env_key
from gemmtune.store.rank_messages import (DistributedTuneError, checked_announcements, checked_answer, checked_share,
                                          disagreement, pool_digest)
from redis_server import free_port

CHILD = Path(__file__).with_name("distributed_agreement_child.py")
RANKS = 2


def _job(out: Path, mode: str, timeout_s: float) -> dict[int, dict]:
    """Start 2 ranks of `mode` by hand; what each wrote, by rank."""
    env = {**os.environ, "GEMMTUNE_STORE": "memory", "GEMMTUNE_CACHE_DIR": str(out / "cache"),
           "GEMMTUNE_NOISE_LIMIT": "1e9", "OMP_NUM_THREADS": "1", "GEMMTUNE_DISTRIBUTED_TIMEOUT_S": str(timeout_s),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(RANKS)}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1] / "src"), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, str(CHILD), mode, str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(RANKS)]
    errors = []
    try:
        for p in procs:
            errors.append(p.communicate(timeout=300)[1])  # a hang fails here
    finally:
        for p in procs:
            p.kill()
    results = {}
    for path in sorted(out.glob("rank*.json")):
        row = json.loads(path.read_text())
        results[row["rank"]] = row["result"]
    assert sorted(results) == list(range(RANKS)), "\n".join(e[-3000:] for e in errors)
    return results


@pytest.fixture(scope="module")
def disagree(tmp_path_factory) -> dict[int, dict]:
    """One job of 2 ranks through every step of `distributed_agreement_child.disagree`, in order."""
    return _job(tmp_path_factory.mktemp("disagree"), "disagree", timeout_s=20)


def _both_refused(results: dict[int, dict], step: str, *needles: str) -> list[str]:
    messages = []
    for rank, r in results.items():
        assert r[step].get("error") == "DistributedTuneError", (rank, r[step])
        for needle in needles:
            assert needle in r[step]["message"], (rank, needle, r[step]["message"])
        messages.append(r[step]["message"])
    return messages


def test_two_ranks_tuning_different_problems_both_get_an_error_naming_both(disagree):
    a, b = disagree[0]["shapes"]["a"], disagree[0]["shapes"]["b"]
    messages = _both_refused(disagree, "two_problems", "rank 0 tunes", "rank 1 tunes", "same order",
                             "nothing was stored")
    assert messages[0] == messages[1]
    assert f"{a[0]}x{a[1]}" in messages[0] and f"{b[0]}x{b[1]}" in messages[0], messages[0]


def test_nothing_is_stored_under_a_wrong_key_when_the_ranks_disagree(disagree):
    """Before, rank 1 kept rank 0's timings under its own problem's key: its next tune was a store hit."""
    for rank, r in disagree.items():
        assert r["own_problem_alone"].get("hit") is False, (rank, r["own_problem_alone"])


def test_a_call_made_on_one_rank_alone_does_not_answer_another_ranks_next_tune(disagree):
    c, d = disagree[0]["shapes"]["c"], disagree[0]["shapes"]["d"]
    [message, _] = _both_refused(disagree, "lone_call", "rank 0 tunes", "rank 1 tunes")
    assert f"{c[0]}x{c[1]}" in message and f"{d[0]}x{d[1]}" in message, message
    together = [disagree[r]["then_together"] for r in range(RANKS)]  # the ranks stay in step afterwards
    assert all("winner" in t for t in together), together
    assert together[0]["winner"] == together[1]["winner"] and sorted(t["hit"] for t in together) == [False, True]


def test_one_problem_from_different_candidate_pools_is_an_error_on_every_rank(disagree):
    _both_refused(disagree, "pools", "different candidate pools", "rank 0 tunes", "rank 1 tunes", "candidate pool ")


def test_a_malformed_answer_is_an_error_naming_the_rank_that_sent_it(disagree):
    owner = disagree[0]["malformed_answer_owner"]
    other = 1 - owner
    assert "winner" in disagree[owner]["malformed_answer"]  # the owner tuned; what it sent is what is wrong
    got = disagree[other]["malformed_answer"]
    assert got.get("error") == "DistributedTuneError", got
    assert f"rank {owner}'s rows" in got["message"] and "ms is str" in got["message"], got
    assert "nothing was stored" in got["message"]


def test_a_malformed_dealt_share_is_an_error_naming_the_rank_that_sent_it(disagree):
    got = disagree[0]["malformed_share"]
    assert got.get("error") == "DistributedTuneError", got
    assert "rank 1's rows" in got["message"] and "ms is str" in got["message"], got
    assert disagree[1]["malformed_share"] == {"rows": 2}  # rank 0's share was well-formed


def test_shared_tunes_still_agree_and_are_tuned_once(disagree):
    for i in range(2):
        got = [disagree[r]["together"][i] for r in range(RANKS)]
        assert all("winner" in g for g in got), got
        assert got[0]["winner"] == got[1]["winner"] and sorted(g["hit"] for g in got) == [False, True], got


def test_a_rank_that_tunes_alone_fails_within_the_timeout(tmp_path):
    """Rank 1 never tunes: rank 0's shared tune waits the exchange timeout (3 s), then fails, no hang."""
    results = _job(tmp_path, "nobody", timeout_s=3)
    got = results[0]["alone"]
    assert got.get("error") == "DistributedTuneError", got
    assert "rank 0 waited in vain" in got["message"] and "same tunes in the same order" in got["message"], got
    assert results[0]["seconds"] < 120, results[0]  # the timeout, not a hang (generous on a loaded machine)


# -- the checks of one message, without ranks ----------------------------------------------------------------

ROW = ("aten_mm", None, "{}", "{}", 0.5, "ok", None)


@pytest.mark.parametrize("message,needle", [
    ("rows", "malformed answer (str)"),
    (("rows", "p", ([ROW], ROW), "extra"), "malformed answer (tuple)"),
    (("pick", "p", ([ROW], ROW)), "malformed answer"),
    (("rows", "q", ([ROW], ROW)), "sent its tune of q to rank 0, which tunes p"),
    (("rows", "p", [ROW]), "expected (rows, pick), got list"),
    (("rows", "p", ((ROW,), ROW)), "expected (rows, pick), got tuple"),
    (("rows", "p", ([ROW[:6]], None)), "a row is tuple of 6 values"),
    (("rows", "p", ([list(ROW)], None)), "a row is list of 7 values"),
    (("rows", "p", ([ROW], ROW[:4] + ("fast",) + ROW[5:])), "ms is str 'fast'"),
    (("rows", "p", ([ROW[:4] + (float("nan"),) + ROW[5:]], None)), "ms is float 'nan'"),
    (("rows", "p", ([ROW[:4] + (-1.0,) + ROW[5:]], None)), "ms is float '-1.0'"),
    (("rows", "p", ([ROW[:4] + (True,) + ROW[5:]], None)), "ms is bool"),
    (("rows", "p", ([(1,) + ROW[1:]], None)), "template is int"),
    (("rows", "p", ([ROW[:2] + ({},) + ROW[3:]], None)), "config is dict"),
    (("error", "p", "RuntimeError: boom"), "rank 1 (its owner) failed to tune it: RuntimeError: boom"),
])
def test_a_bad_answer_is_refused_naming_the_sender(message, needle):
    with pytest.raises(DistributedTuneError) as caught:
        checked_answer(message, 1, "p", 0)
    assert needle in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_well_formed_answer_is_taken_as_sent():
    assert checked_answer(("rows", "p", ([ROW], ROW)), 1, "p", 0) == ([ROW], ROW)
    assert checked_answer(("rows", "p", ([], None)), 1, "p", 0) == ([], None)


def _where(problem: str = "p", info: dict | None = None) -> tuple:
    info = {"device": "cpu", "threads": 2} if info is None else info
    return (env_key(info), info, problem, "mm 8x4 @ 4x2")


@pytest.mark.parametrize("share,needle", [
    ({"p": 1}, "malformed share of the dealt tunes"),
    ([(_where(),)], "malformed dealt tune"),
    ([((1, {}, "p", "d"), ([], None))], "malformed dealt tune"),
    ([((_where()[0], {"device": object()}, "p", "d"), ([], None))], "malformed dealt tune"),
    ([(("0123456789abcdef",) + _where()[1:], ([ROW], ROW))], "is not its env's"),
    ([(_where(), ([ROW[:4] + ("1",) + ROW[5:]], ROW))], "rank 3's rows for p are malformed: ms is str"),
])
def test_a_bad_dealt_share_is_refused_naming_the_sender(share, needle):
    with pytest.raises(DistributedTuneError, match="rank 3") as caught:
        checked_share(share, 3)
    assert needle in str(caught.value), str(caught.value)


def test_a_well_formed_dealt_share_is_taken_as_sent():
    share = [(_where("p"), ([ROW], ROW)), (_where("q"), ([], None))]
    assert checked_share(share, 1) == share


def test_announcements_agree_only_on_one_problem_and_one_pool():
    same = [("p", "d1", "mm 8x4"), ("p", "d1", "mm 8x4")]
    assert disagreement(checked_announcements(same, [0, 1]), [0, 1]) is None
    pools = disagreement([("p", "d1", "mm 8x4"), ("p", "d2", "mm 8x4"), ("p", "d1", "mm 8x4")], [0, 1, 2])
    assert pools is not None and "ranks 0, 2 tunes mm 8x4 (p, candidate pool d1)" in pools
    assert "rank 1 tunes mm 8x4 (p, candidate pool d2)" in pools and "different candidate pools" in pools
    with pytest.raises(DistributedTuneError, match="rank 7 sent a malformed announcement"):
        checked_announcements([("p", "d", "x"), ["p", "d", "x"]], [6, 7])


def test_the_pool_digest_follows_the_candidates_and_the_settings_that_decide_them():
    class Plan:
        asked, check_correctness = "prescreen", True

    class Exhaustive(Plan):
        asked = "exhaustive"

    class Unchecked(Plan):
        check_correctness = False

    aten, blas = Choice("aten_mm", None), Choice("numpy_blas", None)
    tiled = Choice("numba_mm", "h1", (("BM", 32),))
    base = pool_digest([aten, blas, tiled], Plan())
    assert pool_digest([tiled, blas, aten], Plan()) == base  # the order the templates offer them in is no matter
    others = [pool_digest([aten, blas], Plan()), pool_digest([aten, blas, Choice("numba_mm", "h2", (("BM", 32),))], Plan()),
              pool_digest([aten, blas, Choice("numba_mm", "h1", (("BM", 64),))], Plan()),
              pool_digest([aten, blas, tiled], Exhaustive()), pool_digest([aten, blas, tiled], Unchecked())]
    assert len({base, *others}) == 6
