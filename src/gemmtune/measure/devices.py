"""All GPUs of one host: a list of problems dealt across devices, one worker process per device.

`slots(gpus)` names the visible CUDA devices to use (at most `gpus` of them), each a `Slot`: the
device as this process names it ("cuda:1"), the device its worker sees (its only one: "cuda:0"),
its kind (device name and compute capability) and the worker's environment, which is this
process's own (NCCL_NVLS_ENABLE, TRITON_CACHE_DIR, GEMMTUNE_CACHE_DIR and the rest pass on) with
`CUDA_VISIBLE_DEVICES` naming that one GPU.  Workers of every slot inherit the same on-disk compile
caches, so a binary one worker built is a cache hit for the others of its kind.

`deal(items, slots)` gives each kind of device the whole list, dealt across that kind's slots: a
slot's thread takes the next problem, runs it in its worker (`item.run_on(slot.device)` there) and
takes another.  A worker that dies takes only its problem down: the worker is started afresh for
the next one, and the problem goes to another slot of its kind, at most once per slot; a problem
every slot's worker died on is reported failed.  A problem that raises in the worker fails at once
(the error is the problem's, not the device's).  The device list and the worker factory are
arguments, so a CPU machine tests the dealing with stand-in workers.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..core.children import child_env
from .jobs import WorkerJob
from .process import Worker, WorkerLost

log = logging.getLogger("gemmtune")
PROBLEM_TIMEOUT_S = 3600.0
"""A worker that does not answer one problem within this long is taken for hung (its own tune
bounds each compile and run far below this)."""


class Item(Protocol):
    """A problem to deal: picklable, `run_on(device)` does its work in the worker, on `device`."""

    def run_on(self, device: str) -> Any: ...


@dataclass(frozen=True)
class Slot:
    """One device of the deal and the environment its worker starts with.

    Example:
        >>> s = Slot("cuda:1", "cpu", "stand-in", {"CUDA_VISIBLE_DEVICES": "1"})
        >>> s.label, s.env["CUDA_VISIBLE_DEVICES"]
        ('cuda:1', '1')
    """

    label: str  # the device as this process names it
    device: str  # the device the worker sees and runs on
    kind: str  # slots of one kind share picks (device name and capability)
    env: Mapping[str, str]


@dataclass(frozen=True)
class Dealt:
    """What became of one problem on one kind of device: its value, or why it failed."""

    index: int  # the problem's position in the dealt list
    kind: str
    label: str | None  # the slot that ran it to the end (None: no worker survived it)
    value: Any = None
    error: str | None = None
    lost_on: tuple[str, ...] = ()  # the slots whose worker died on it

    @property
    def ok(self) -> bool:
        return self.error is None


class _Run(WorkerJob):
    """The job a slot's worker runs: one item, on the worker's device."""

    def __init__(self, item: Item, device: str):
        self.item, self.device = item, device

    def run(self, state: Any) -> Any:
        return self.item.run_on(self.device)


def slot_for(index: int, kind: str) -> Slot:
    """The slot of CUDA device `index` of this process: its worker sees that GPU alone, as cuda:0."""
    return Slot(f"cuda:{index}", "cuda:0", kind, child_env(index))


def slots(gpus: int | None) -> list[Slot]:
    """The visible CUDA devices to deal over, at most `gpus` of them (None: all), in index order.

    Example:
        >>> import torch
        >>> slots(None) == [] if not torch.cuda.is_available() else True
        True
    """
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    count = count if gpus is None else min(count, gpus)
    return [slot_for(i, device_kind(i)) for i in range(count)]


def device_kind(index: int) -> str:
    """A CUDA device's kind: its name and compute capability (picks are kept per kind)."""
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} sm_{major}{minor}"


def slots_for(device: str, gpus: int | None) -> list[Slot]:
    """The GPUs a suite or sweep on `device` is dealt across: none (tune here, as with one GPU) on CPU,
    with `gpus=1`, or where fewer than two CUDA devices are visible; else at most `gpus` of them.

    Example:
        >>> slots_for("cpu", None), slots_for("cuda", 1)
        ([], [])
    """
    if not device.startswith("cuda") or gpus == 1:
        return []
    found = slots(gpus)
    return found if len(found) > 1 else []


def home_kind(slots: Sequence[Slot], device: str) -> str:
    """The kind of `device` among `slots` (the first slot's where `device` is not one of them)."""
    label = "cuda:0" if device == "cuda" else device
    return next((s.kind for s in slots if s.label == label), slots[0].kind)


def start_worker(slot: Slot, timeout_s: float = PROBLEM_TIMEOUT_S) -> Worker:
    """The worker process of `slot` (the default worker factory of `deal`)."""
    return Worker(slot.device, timeout_s, env=slot.env)


def deal(items: Sequence[Item], slots: Sequence[Slot], start: Callable[[Slot], Any] = start_worker,
         timeout_s: float = PROBLEM_TIMEOUT_S, on_done: Callable[[Dealt], None] | None = None) -> list[Dealt]:
    """Every item run once on each kind of `slots`, dealt across the slots of that kind (module
    docstring).  Returns one `Dealt` per (kind, item), kinds in the order they first appear;
    `on_done(dealt)` is called as each one is decided (from the slots' threads, one call at a time).

    Example:
        >>> class Square:
        ...     def __init__(self, x): self.x = x
        ...     def run_on(self, device): return self.x * self.x
        >>> class InThread:  # a stand-in worker: runs the job here
        ...     def call(self, job, timeout_s=None): return job.run(None)
        ...     def close(self, kill=False): pass
        >>> s = [Slot(f"cuda:{i}", "cpu", "k", {}) for i in range(2)]
        >>> [d.value for d in deal([Square(2), Square(3)], s, start=lambda slot: InThread())]
        [4, 9]
    """
    kinds: dict[str, list[Slot]] = {}
    for slot in slots:
        kinds.setdefault(slot.kind, []).append(slot)
    report = _Reporter(on_done)
    tables = [_Table(kind, len(items), [s.label for s in group], report) for kind, group in kinds.items()]
    threads = [threading.Thread(target=_serve, args=(table, items, slot, start, timeout_s),
                                name=f"gemmtune-deal-{slot.label}", daemon=True)
               for table, group in zip(tables, kinds.values()) for slot in group]
    for t in threads:  # every kind at once: each GPU of the host busy
        t.start()
    for t in threads:
        t.join()
    if report.raised:
        raise report.raised[0]
    return [table.done[i] for table in tables for i in range(len(items))]


class _Table:
    """The problems of one kind still to run, which slots' workers died on them, and what is done."""

    def __init__(self, kind: str, count: int, labels: Sequence[str], report: Callable[[Dealt], None]):
        self.kind, self.labels, self.report = kind, frozenset(labels), report
        self.pending = list(range(count))
        self.lost: dict[int, list[str]] = {i: [] for i in range(count)}
        self.done: dict[int, Dealt] = {}
        self.running = 0
        self.cond = threading.Condition()

    def take(self, label: str) -> int | None:
        """The next problem for `label` (one its worker has not died on); None when none is left for it."""
        with self.cond:
            while True:
                i = next((i for i in self.pending if label not in self.lost[i]), None)
                if i is not None:
                    self.pending.remove(i)
                    self.running += 1
                    return i
                if self.running == 0:  # nothing can come back to the list: what is left is another slot's
                    return None
                self.cond.wait()

    def finish(self, i: int, label: str, value: Any = None, error: str | None = None) -> None:
        with self.cond:
            self.done[i] = Dealt(i, self.kind, label, value, error, tuple(self.lost[i]))
            self.running -= 1
            self.cond.notify_all()
        self.report(self.done[i])

    def lose(self, i: int, label: str, why: str) -> None:
        """`label`'s worker died on problem `i`: it goes to another slot, or fails when every slot lost it."""
        with self.cond:
            self.lost[i].append(label)
            self.running -= 1
            failed = self.labels <= set(self.lost[i])
            if failed:
                self.done[i] = Dealt(i, self.kind, None, None, f"the worker died on every device ({why})",
                                     tuple(self.lost[i]))
            else:
                self.pending.append(i)
            self.cond.notify_all()
        if failed:
            self.report(self.done[i])


class _Reporter:
    """`on_done` called one at a time; what it raised is kept, and raised by `deal` once all is done."""

    def __init__(self, on_done: Callable[[Dealt], None] | None):
        self.on_done, self.lock = on_done, threading.Lock()
        self.raised: list[BaseException] = []

    def __call__(self, dealt: Dealt) -> None:
        with self.lock:
            if self.on_done is not None and not self.raised:
                try:
                    self.on_done(dealt)
                except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread by `deal`
                    self.raised.append(exc)


def _serve(table: _Table, items: Sequence[Item], slot: Slot, start: Callable[[Slot], Any], timeout_s: float) -> None:
    """One slot's loop: take a problem, run it in the slot's worker (started when first needed, and
    again after one died), until no problem is left for this slot."""
    worker = None
    try:
        while (i := table.take(slot.label)) is not None:
            try:
                worker = worker or start(slot)
                value = worker.call(_Run(items[i], slot.device), timeout_s=timeout_s)
            except WorkerLost as exc:
                log.warning("gemmtune: %s: the worker died on problem %d (%s); it goes to another device",
                            slot.label, i, exc)
                if worker is not None:
                    worker.close(kill=True)
                worker = None
                table.lose(i, slot.label, str(exc))
            except Exception as exc:  # noqa: BLE001 - the problem raised in the worker: it fails, the worker serves on
                table.finish(i, slot.label, error=str(exc))
            else:
                table.finish(i, slot.label, value)
    finally:
        if worker is not None:
            worker.close()
