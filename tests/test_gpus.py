"""All GPUs of one host, dealt on a CPU machine: stand-in devices are CPU worker processes pinned with
CUDA_VISIBLE_DEVICES as a GPU's worker is (`gemmtune.measure.devices`), or in-thread stand-ins for
the dealing alone.  Tunes use the aten and NumPy kernels on tiny shapes; nothing asserts a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import gemmtune
from gemmtune.core.children import child_env
from gemmtune.core.errors import SettingsError
from gemmtune.measure import devices
from gemmtune.measure.devices import Slot, deal, home_kind, slots_for
from gemmtune.measure.process import WorkerLost
from gemmtune.offline import gpus
from gemmtune.offline.suite import ProblemSpec
from gemmtune.store.keys import Row
from gemmtune.store.relay import Saved
from gemmtune.store.sqlite import Store

BACKENDS = ("extern", "numpy")  # two library candidates: each tune times something


# -- items the workers run (module level: a worker imports this module to unpickle them) ---------------------

class Square:
    def __init__(self, x: int):
        self.x = x

    def run_on(self, device: str) -> tuple[int, str]:
        return self.x * self.x, device


class Pinned:
    """What a worker's environment says: its GPU, and the variables it got from the caller."""

    def run_on(self, device: str) -> dict:
        return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "TRITON_CACHE_DIR")}


class DiesOnce:
    """Kills its worker the first time it runs (wherever that is), then succeeds."""

    def __init__(self, marker: str, x: int):
        self.marker, self.x = marker, x

    def run_on(self, device: str) -> int:
        if not os.path.exists(self.marker):
            Path(self.marker).write_text("died")
            os._exit(1)
        return self.x


class DiesAlways:
    def run_on(self, device: str) -> int:
        os._exit(1)


class Raises:
    def run_on(self, device: str) -> int:
        raise ValueError("a bad problem")


class KindSave:
    """A worker tune's outcome whose store key is the worker's device (a stand-in for its kind)."""

    def __init__(self, problem: str):
        self.problem = problem

    def run_on(self, device: str) -> gpus.Tuned:
        pick = Row("aten_mm", None, "{}", "{}", 1.0, "ok")
        return gpus.Tuned((Saved(device, {"device": device}, self.problem, self.problem, (pick,), pick, False, None),),
                          {}, "aten_mm")


# -- stand-in devices --------------------------------------------------------------------------------------------

class InThread:
    """A stand-in worker running each job in the slot's thread; `dies_on` items raise WorkerLost on
    the slots named there, as a dead worker does."""

    def __init__(self, slot: Slot, dies_on: dict, log: list):
        self.slot, self.dies_on, self.log = slot, dies_on, log

    def call(self, job, timeout_s=None):
        self.log.append((self.slot.label, job.item))
        if self.slot.label in self.dies_on.get(id(job.item), ()):
            raise WorkerLost("worker died (exit code 1)")
        return job.run(None)

    def close(self, kill=False):
        pass


def in_thread(dies_on: dict | None = None, log: list | None = None):
    log = [] if log is None else log
    return (lambda slot: InThread(slot, dies_on or {}, log)), log


def fake_slots(count: int, kind: str = "H200 sm_90", device: str = "cpu") -> list[Slot]:
    return [Slot(f"cuda:{i}", device, kind, {}) for i in range(count)]


def standins(count: int, kind: str = "stand-in") -> list[Slot]:
    """CPU worker processes as cuda:0..count-1, pinned by the same code that pins a GPU's worker."""
    return [Slot(f"cuda:{i}", "cpu", kind, child_env(i)) for i in range(count)]


# -- the dealing ---------------------------------------------------------------------------------------------------

def test_dealing_covers_every_problem_once_across_the_slots():
    items = [Square(i) for i in range(9)]
    start, log = in_thread()
    dealt = deal(items, fake_slots(3), start=start)
    assert [d.index for d in dealt] == list(range(9)) and all(d.ok for d in dealt)
    assert [d.value[0] for d in dealt] == [i * i for i in range(9)]
    ran = [item for _, item in log]
    assert sorted(id(i) for i in ran) == sorted(id(i) for i in items)  # each once, no more
    assert {d.label for d in dealt} <= {"cuda:0", "cuda:1", "cuda:2"}


def test_a_lost_problem_goes_to_another_slot_and_fails_after_every_slot_lost_it():
    items = [Square(i) for i in range(4)]
    start, log = in_thread({id(items[1]): ("cuda:0",), id(items[2]): ("cuda:0", "cuda:1")})
    dealt = deal(items, fake_slots(2), start=start)
    assert [d.ok for d in dealt] == [True, True, False, True]
    one, two = dealt[1], dealt[2]
    assert one.label == "cuda:1" and one.value[0] == 1 and one.lost_on in ((), ("cuda:0",))
    assert sorted(two.lost_on) == ["cuda:0", "cuda:1"] and "died on every device" in two.error
    assert sum(1 for label, item in log if item is items[2]) == 2  # at most once per slot


def test_a_problem_that_raises_fails_at_once_and_the_others_are_done():
    items = [Square(1), Raises(), Square(3)]
    start, log = in_thread()
    dealt = deal(items, fake_slots(2), start=start)
    assert [d.ok for d in dealt] == [True, False, True]
    assert "a bad problem" in dealt[1].error and dealt[1].lost_on == ()
    assert sum(1 for _, item in log if item is items[1]) == 1  # not retried: the problem's fault


def test_two_kinds_each_tune_every_problem_and_are_stored_apart():
    slots = [*fake_slots(2, "H200 sm_90", "standin-h200"), Slot("cuda:2", "standin-a100", "A100 sm_80", {})]
    start, _ = in_thread()
    dealt = deal([KindSave(f"p{i}") for i in range(3)], slots, start=start)
    by_kind = {k: [d for d in dealt if d.kind == k] for k in ("H200 sm_90", "A100 sm_80")}
    assert [len(v) for v in by_kind.values()] == [3, 3]
    assert {d.label for d in by_kind["A100 sm_80"]} == {"cuda:2"}
    assert {d.label for d in by_kind["H200 sm_90"]} <= {"cuda:0", "cuda:1"}
    store = Store(":memory:")
    assert gpus.write_saves(dealt, store) == 6
    for env in ("standin-h200", "standin-a100"):  # one pick per problem under each kind's key
        assert all(store.load(env, f"p{i}").pick is not None for i in range(3))
    assert home_kind(slots, "cuda:2") == "A100 sm_80" and home_kind(slots, "cuda") == "H200 sm_90"


def test_what_on_done_raises_is_raised_by_deal():
    start, _ = in_thread()

    def boom(d):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        deal([Square(1), Square(2)], fake_slots(2), start=start, on_done=boom)


# -- which GPUs: Settings.gpus, --gpus -------------------------------------------------------------------------

def test_gpus_setting_is_typed_and_read_from_the_environment():
    assert gemmtune.Settings().gpus is None and gemmtune.Settings(gpus=2).gpus == 2
    assert gemmtune.Settings.from_env({"GEMMTUNE_GPUS": "3"}).gpus == 3
    assert gemmtune.Settings.from_env({"GEMMTUNE_GPUS": "none"}).gpus is None
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(SettingsError, match="gpus"):
            gemmtune.Settings(gpus=bad)
    with pytest.raises(SettingsError, match="GEMMTUNE_GPUS"):
        gemmtune.Settings.from_env({"GEMMTUNE_GPUS": "two"})


@pytest.fixture
def three_gpus(monkeypatch):
    """This process sees three CUDA devices of one kind (only their count and kind are asked)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(devices, "device_kind", lambda index: "H200 sm_90")


def test_slots_are_the_visible_gpus_capped_by_gpus_and_none_for_one(three_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,7")
    assert [s.label for s in slots_for("cuda", None)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots_for("cuda:1", 2)] == ["4", "5"]
    assert all(s.device == "cuda:0" for s in slots_for("cuda", None))  # a worker sees its GPU as cuda:0
    assert slots_for("cuda", 1) == [] and slots_for("cpu", None) == []  # one GPU, or none: today's path


def test_gpus_1_tunes_the_suite_as_before_and_bad_values_exit_2(tmp_path, capsys, three_gpus, monkeypatch):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps([{"M": 8, "K": 8, "N": 8}, {"M": 4, "K": 8, "N": 2}]))
    monkeypatch.setattr(gpus, "deal_suite", lambda *a, **k: pytest.fail("dealt with --gpus 1"))
    from gemmtune.cli import main

    assert main(["tune", "--suite", str(suite), "--device", "cpu", "--gpus", "1", "--backends", "extern",
                 "--store", "memory", "--no-progress"]) == 0
    assert "tuned on" not in capsys.readouterr().out
    assert main(["tune", "--suite", str(suite), "--device", "cpu", "--gpus", "0"]) == 2
    assert capsys.readouterr().err.strip() == "gemmtune: error: argument --gpus: must be >= 1, got 0"


# -- real worker processes as stand-in GPUs --------------------------------------------------------------------

def test_each_worker_is_pinned_to_its_gpu_and_gets_the_callers_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,3")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))  # one compile cache for every worker
    dealt = deal([Pinned(), Pinned(), Pinned()], standins(2))
    assert all(d.ok for d in dealt)
    for d in dealt:
        assert d.value["CUDA_VISIBLE_DEVICES"] == {"cuda:0": "6", "cuda:1": "3"}[d.label]
        assert d.value["NCCL_NVLS_ENABLE"] == "0" and d.value["TRITON_CACHE_DIR"] == str(tmp_path / "triton")


def test_a_worker_that_dies_loses_only_its_problem_which_succeeds_on_another(tmp_path):
    items = [Square(2), DiesOnce(str(tmp_path / "died"), 7), Square(3), DiesAlways()]
    dealt = deal(items, standins(2))
    assert [d.ok for d in dealt] == [True, True, True, False]
    assert [dealt[0].value[0], dealt[1].value, dealt[2].value[0]] == [4, 7, 9]
    assert len(dealt[1].lost_on) == 1 and dealt[1].label not in dealt[1].lost_on  # retried elsewhere
    assert sorted(dealt[3].lost_on) == ["cuda:0", "cuda:1"]


SPECS = [ProblemSpec(8, 16, 8, name="a"), ProblemSpec(4, 8, 16, name="b"), ProblemSpec(16, 4, 4, op="addmm", name="c")]


def test_a_suite_dealt_to_workers_stores_one_pick_per_problem_written_here(tmp_path):
    location = str(tmp_path / "picks.sqlite")
    store = Store(location)
    settings = gemmtune.Settings(backends=BACKENDS, store=location)
    dealt = gpus.tune_suite(SPECS, settings, location, store, standins(2))
    assert [d.ok for d in dealt] == [True] * 3
    assert all(len(d.value.saved) == 1 for d in dealt)  # the worker's one save, made by this process
    assert len(store.problems()) == 3
    for spec, d in zip(SPECS, dealt):  # this process's tune is the store's answer: the worker's pick
        sel = gemmtune.tune(spec.op, *spec.tensors("cpu"), settings=settings, store=store)
        assert sel.cache_hit and sel.winner.key == d.value.winner
        assert gpus.with_facts(sel, d).cache_hit is False


def test_tune_suite_on_several_gpus_through_the_cli(tmp_path, capsys, monkeypatch):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps([{"M": s.M, "K": s.K, "N": s.N, "op": s.op, "name": s.name} for s in SPECS]))
    monkeypatch.setattr(gpus, "slots_for", lambda device, count: standins(2))
    from gemmtune.cli import main

    out = tmp_path / "out.json"
    rc = main(["tune", "--suite", str(suite), "--device", "cpu", "--backends", ",".join(BACKENDS), "--store",
               str(tmp_path / "s.sqlite"), "--json", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.out.count("tuned on cuda:") == 3 and "dealing 3 shapes across 2 GPUs" in captured.err
    results = json.loads(out.read_text())["results"]
    assert [r["name"] for r in results] == ["a", "b", "c"] and not any(r["cache_hit"] for r in results)
    assert len(Store(tmp_path / "s.sqlite").problems()) == 3


def test_a_sweep_dealt_to_workers_records_each_shape_once(tmp_path):
    from gemmtune.offline.dataset import read_lines
    from gemmtune.offline.sweep import sweep

    out, lines = tmp_path / "sweep.jsonl", []
    settings = gemmtune.Settings(backends=BACKENDS)
    assert sweep(SPECS, out, "cpu", settings, log=lines.append, slots=standins(2)) == 3
    shapes = [r for r in read_lines(out) if r.get("type") == "shape"]
    assert sorted(r["name"] for r in shapes) == ["a", "b", "c"] and all(r["choices"] for r in shapes)
    assert sweep(SPECS, out, "cpu", settings, log=lines.append, slots=standins(2)) == 0  # resumed: all done


def test_a_warmup_dealt_to_workers_finds_every_problem_in_the_store(tmp_path, monkeypatch):
    from gemmtune.dispatch import eager
    from gemmtune.dispatch.spread import as_tuned, spread
    from gemmtune.dispatch.table import Recorded

    monkeypatch.setenv("GEMMTUNE_STORE", str(tmp_path / "warm.sqlite"))
    recs = [Recorded("mm", (torch.randn(8, 16), torch.randn(16, 4)), 1.0, 1.0, BACKENDS, None),
            Recorded("mm", (torch.randn(4, 8), torch.randn(8, 8).t()), 1.0, 1.0, BACKENDS, None)]
    dealt = spread(recs, traced=False, slots=standins(2))
    assert sorted(dealt) == [0, 1] and all(len(d.value[0]) == 1 for d in dealt.values())
    for i, rec in enumerate(recs):
        sel = eager.prepare(rec.op, rec.tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout)
        assert sel.cache_hit  # what the worker tuned, from the store
        assert as_tuned((sel, 0.0), dealt[i])[0].cache_hit is False
    monkeypatch.setenv("GEMMTUNE_STORE", "off")
    assert spread(recs, traced=False, slots=standins(2)) == {}  # nothing could be shared
