"""A suite or a sweep dealt across every GPU of the host (`gemmtune.measure.devices`).

`gemmtune tune --suite` on CUDA with more than one GPU to use (`Settings.gpus`, `--gpus N`) tunes
each shape in one GPU's worker process: each kind of GPU tunes every shape (its picks are its own,
kept under its device's store key), dealt across that kind's GPUs.  The workers read the caller's
store and send back what they would write; the caller writes it (`store.relay`), then tunes each
shape of its own device's kind as before, which finds the pick in the store: the Selection carries
the worker's facts (strategy, times, runs) and which GPU tuned it.  `gemmtune sweep` deals its
shapes across the GPUs of the sweep device's kind only (a dataset holds one device's timings); each
record is appended as its shape finishes.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..core.settings import Settings
from ..measure import devices
from ..measure.devices import Dealt, Slot, home_kind, slots_for  # noqa: F401 - slots_for: the CLI's
from ..store.relay import RelayStore, Saved
from .suite import ProblemSpec

log = logging.getLogger("gemmtune")
FACTS = ("strategy", "benchmark_runs", "compile_s", "benchmark_s", "prescreen_s", "tuning_s", "cache_hit",
         "from_store", "stale_entries", "budget_exhausted", "isolation", "overlapped", "noisy", "provisional",
         "background_load")
"""The Selection fields a worker's tune sends back with its saves (the caller's Selection is a store hit)."""


@dataclass(frozen=True)
class Tuned:
    """A worker's tune of one shape: what it would have saved, the Selection's facts, its pick."""

    saved: tuple[Saved, ...]
    facts: dict
    winner: str


@dataclass(frozen=True)
class TuneSpec:
    """One suite shape tuned in a worker, on the worker's device, against a relay of `location`'s store."""

    spec: ProblemSpec
    settings: Settings
    location: str | None

    def run_on(self, device: str) -> Tuned:
        from ..engine import tune
        from ..store.locations import shared_store
        from ..store.trust import Trust

        relay = RelayStore(shared_store(self.location, Trust.of(self.settings)))
        sel = tune(self.spec.op, *self.spec.tensors(device), settings=self.settings, store=relay,
                   **self.spec.tune_kwargs)
        return Tuned(tuple(relay.saved), {f: getattr(sel, f) for f in FACTS}, sel.winner.key)


def write_saves(dealt: Sequence[Dealt], store: Any) -> int:
    """Write every successful worker tune's saves into `store` (one writer: this process); how many."""
    saves = [s for d in dealt if d.ok for s in d.value.saved]
    for saved in saves:
        saved.write(store)
    return len(saves)


def tune_suite(specs: Sequence[ProblemSpec], settings: Settings, location: str | None, store: Any,
               slots: Sequence[Slot], start: Callable[[Slot], Any] = devices.start_worker,
               on_done: Callable[[Dealt], None] | None = None) -> list[Dealt]:
    """Tune `specs` across `slots` (module docstring) and write their picks into `store`; returns one
    Dealt per (kind, shape), `Dealt.value` a `Tuned`."""
    jobs = [TuneSpec(spec, settings, location) for spec in specs]
    dealt = devices.deal(jobs, slots, start=start, on_done=on_done)
    write_saves(dealt, store)
    return dealt


def with_facts(sel: Any, dealt: Dealt) -> Any:
    """The caller's store-hit Selection of a shape a worker tuned, with the worker's facts."""
    return dataclasses.replace(sel, **dealt.value.facts)


def sweep_shapes(specs: Sequence[ProblemSpec], jobs: Sequence[devices.Item], slots: Sequence[Slot], device: str,
                 append: Callable[[dict, str], None], start: Callable[[Slot], Any] = devices.start_worker) -> int:
    """Record `specs` (their `jobs`: each returns (record, line)) across the slots of `device`'s kind;
    `append(record, line)` as each finishes, in the order they finish.  Returns how many were
    recorded; a shape that failed is logged."""
    kind = home_kind(slots, device)
    lock, added = threading.Lock(), [0]

    def done(d: Dealt) -> None:
        with lock:
            if d.ok:
                append(*d.value)
                added[0] += 1
            else:
                log.warning("gemmtune sweep: %s: not recorded: %s", specs[d.index].name, d.error)

    devices.deal(jobs, [s for s in slots if s.kind == kind], start=start, on_done=done)
    return added[0]


def deal_suite(specs: Sequence[ProblemSpec], settings: Settings, location: str | None, device: str,
               slots: Sequence[Slot], log_line: Callable[[str], None],
               start: Callable[[Slot], Any] = devices.start_worker) -> tuple[Any, dict[int, Dealt]]:
    """`tune_suite` for `gemmtune tune --suite`: (the store the picks were written to, to tune from;
    the Dealt of each shape on `device`'s kind by index).  A line per shape as it finishes."""
    from ..store.locations import shared_store
    from ..store.trust import Trust

    store = shared_store(location, Trust.of(settings))  # held: "off" is a fresh store each time, this one serves the suite
    kind = home_kind(slots, device)
    log_line(f"dealing {len(specs)} shapes across {len(slots)} GPUs: " + ", ".join(f"{s.label} ({s.kind})"
                                                                                  for s in slots))

    def done(d: Dealt) -> None:
        where = d.label if d.ok else "failed"
        log_line(f"[{specs[d.index].name or specs[d.index].describe()}] {d.kind}: {where}"
                 + (f" ({d.error})" if d.error else f", {d.value.facts['tuning_s']:.1f} s"))

    dealt = tune_suite(specs, settings, location, store, slots, start=start, on_done=done)
    return store, {d.index: d for d in dealt if d.kind == kind}
