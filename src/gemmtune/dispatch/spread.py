"""A model warm-up's problems dealt across the GPUs of the host (`gemmtune.measure.devices`).

Where more than one GPU of the model's kind is visible (and `Settings.gpus` allows more than one),
`warmup` first tunes its recorded problems in one worker process per GPU: each worker runs the
problem as the warm-up itself would (`warmup.prepare_for`) against a relay of the store
(`store.relay`), and this process writes what they would have written.  The warm-up's own loop then
finds every problem in the store.  With the store off nothing could be shared, so nothing is dealt.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..core.inputs import device_str
from ..core.layout import call_layout
from ..core.settings import Settings
from ..measure import devices
from ..measure.devices import Dealt, Slot
from ..store.locations import shared_store
from ..store.trust import Trust
from ..store.relay import relaying
from . import eager, route
from .table import Recorded

log = logging.getLogger("gemmtune")


@dataclass(frozen=True)
class WarmProblem:
    """One recorded problem (its operands on the CPU, to travel) tuned in a worker, on its device."""

    rec: Recorded
    traced: bool
    location: str | None

    def run_on(self, device: str) -> tuple[tuple, bool, float]:
        """(the saves, whether the store had it, the seconds it took) of this problem, on `device`."""
        rec = dataclasses.replace(self.rec, tensors=tuple(t.to(device) for t in self.rec.tensors))
        t0 = time.perf_counter()
        with relaying(self.location) as relay:
            sel = prepare_for(rec, self.traced)
        return tuple(relay.saved), bool(sel is not None and sel.cache_hit), time.perf_counter() - t0


def spread(items: Sequence[Recorded], traced: bool, slots: Sequence[Slot] | None = None,
           start: Callable[[Slot], Any] = devices.start_worker) -> dict[int, Dealt]:
    """Tune the CUDA problems of `items` across the GPUs of their device's kind, where there is more
    than one to use, and write their picks into the store; `slots` given: every item across those.
    Returns what was dealt, by position in `items` (nothing on one GPU, on CPU, or with the store off)."""
    settings = Settings.from_env()
    at = [i for i in range(len(items)) if items[i].op != "scaled_mm"]  # fp8: tuned by the warm-up's own loop
    if slots is None:  # the model's GPUs: those of its device's kind
        at = [i for i in at if items[i].tensors and items[i].tensors[0].is_cuda]
        device = device_str(items[at[0]].tensors[0].device) if at else "cpu"
        found = devices.slots_for(device, settings.gpus)
        slots = [s for s in found if s.kind == devices.home_kind(found, device)]
    if len(slots) < 2 or not at or settings.store == "off":
        return {}
    jobs = [WarmProblem(dataclasses.replace(items[i], tensors=tuple(t.cpu() for t in items[i].tensors)), traced,
                        settings.store) for i in at]
    dealt = devices.deal(jobs, slots, start=start)
    store = shared_store(settings.store, Trust.of(settings))
    for d in dealt:
        if d.ok:
            for saved in d.value[0]:
                saved.write(store)
        else:  # the warm-up's own loop tunes it here
            log.warning("gemmtune.warmup: %s: %s", items[at[d.index]].describe(), d.error)
    return {at[d.index]: d for d in dealt if d.ok}


def as_tuned(outcome: tuple[Any, float], dealt: Dealt | None) -> tuple[Any, float]:
    """The warm-up's (Selection, seconds) of a problem, as the worker that tuned it found it (the
    Selection here is the store's answer to what the worker wrote)."""
    sel, seconds = outcome
    if dealt is None or sel is None:
        return outcome
    return dataclasses.replace(sel, cache_hit=dealt.value[1]), dealt.value[2]


def prepare_for(rec: Recorded, traced: bool) -> Any:
    """Tune (or read from the store) one recorded problem as the warm-up does; its Selection."""
    prepare = eager.prepare
    if traced and call_layout(rec.out_layout, rec.tensors[-1]) != "padded":
        # as the compile will meet it: built by Inductor from the store (dispatch.route), or traced; a
        # padded layout's call runs as the opaque op there, through the eager dict (dispatch.compiled)
        from . import compiled  # registers the traced ops (torch's compiler stack): only for a compile

        inductor = route.to_inductor(rec.tensors, rec.backends, rec.out_layout)
        prepare = compiled.prepare_inductor if inductor else compiled.prepare_traced
    return prepare(rec.op, rec.tensors, rec.alpha, rec.beta, rec.backends, rec.out_layout)
