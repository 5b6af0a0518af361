"""The choices handler that feeds Inductor gemmtune's picks while it lowers a graph.

`GemmtuneChoices` is a subclass of the installed torch's `LookupTableChoices`.  For every `mm`,
`addmm` and `bmm` Inductor lowers, it looks the problem up (its own table: picks tuned in this
process or loaded from a JSON table); a miss tunes the problem with `gemmtune.tune` on stand-in
tensors of the kernel inputs' sizes, strides and dtypes (the store answers problems tuned before)
and keeps the pick.  It then hands Inductor only the pick's entry: one choice, nothing benchmarked,
and Inductor still generates its own shape-specialised code and fuses epilogues into it.  A library
pick (which fuses nothing) comes with its fusion companion where one was measured close to it
(`InductorPick.companions`): Inductor then times the two and weighs fusing the epilogue.

One problem may be asked for in several calls (addmm: library kernels, then Triton templates): a
known problem whose pick is not among a call's templates gets no choice from that call when another
call builds it.  When no call can build it, a stand-in does: a Triton pick's tile on Inductor's plain
Triton template (a TMA pick where TMA is off), else the op's library kernel; a mm/bmm call that can
build neither keeps Inductor's own list.  Entries whose template source changed are dropped with a
RuntimeWarning.  `torch._scaled_mm` (Inductor's op name "scaled_mm") is answered in `inductor.scaled`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections import Counter
from typing import Any, Mapping

import torch

from . import dynamic
from .compat import inductor_templates, require
from .entries import FUSION, InductorPick, entry_options as _kwargs, fuse_gain_ms
from .extern import EXTERN_TEMPLATES, EXTERN_UID, extern_choice
from .shortlist import SHORTLIST, shortlist_choices
from .window import current_node, has_epilogue, in_window, user_autotunes

log = logging.getLogger("gemmtune")

OPS = ("mm", "addmm", "bmm")


def warn_stale(uid: str, have: Any, want: Any, where: str) -> None:
    """The one warning for an entry whose template source changed since it was written."""
    msg = (f"gemmtune.inductor: {where}: entry for {uid} was written for template source "
           f"{str(have)[:12]}, the installed torch's is {str(want)[:12]}: entry dropped")
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def pick_of_entries(op: str, key: str, entries: list[Mapping[str, Any]]) -> InductorPick:
    """A loaded table's entries as an InductorPick (exact when there is one)."""
    return InductorPick(op, (key,), tuple(dict(e) for e in entries), len(entries) == 1, "lookup table")


def make_handler(table: Mapping[str, list] | None = None, tune_on_miss: bool = True, settings: Any = None,
                 templates: str = "inductor", fusion: int | str = FUSION) -> Any:
    """A `GemmtuneChoices` (a subclass of the installed torch's LookupTableChoices)."""
    base = require()

    class GemmtuneChoices(_Mixin, base):  # type: ignore[misc, valid-type]
        pass

    return GemmtuneChoices(table, tune_on_miss, settings, templates, fusion)


def _autotuning() -> bool:
    """Whether the compile autotunes GEMMs itself (a max-autotune mode), not only through gemmtune's window."""
    return user_autotunes()


def is_gemmtune_handler(handler: Any) -> bool:
    """Whether `handler` (Inductor's `V.choices`) is an installed gemmtune handler."""
    return isinstance(handler, _Mixin)


def _must_answer(pick: InductorPick, op_name: str) -> bool:
    """Whether a call that can build nothing of the pick must still give Inductor choices: always for
    mm and bmm (one call each); for addmm only when its library call does not happen (no ATEN backend)
    while the pick is a library kernel."""
    if op_name != "addmm":
        return True
    if not all(str(e.get("template_id", "")).startswith("aten::") for e in pick.entries):
        return False
    try:
        from torch._inductor.utils import use_aten_gemm_kernels

        return not use_aten_gemm_kernels()
    except Exception:  # noqa: BLE001 - an Inductor without this helper: assume the library call happens
        return False


class _Mixin:
    """The handler's behaviour; mixed with LookupTableChoices by `make_handler` (torch is optional)."""

    def __init__(self, table: Mapping[str, list] | None, tune_on_miss: bool, settings: Any, templates: str,
                 fusion: int | str = FUSION):
        super().__init__()
        self.picks: dict[str, InductorPick] = {}
        self.tune_on_miss, self.settings, self.templates, self.fusion = tune_on_miss, settings, templates, fusion
        self.stats: Counter = Counter()
        self.measure = "inductor"  # GPU: Inductor times its own kernels for a problem the store lacks
        self.shortlist: int | None = SHORTLIST  # ... its `shortlist` best-modelled configs per template
        self.gemv: bool | str = "autotune"  # an M = 1 / N = 1 mm lowered as a tuned reduction (inductor.gemv)
        self.pipeline = False  # new problems timed by Inductor's pipelined autotuning (inductor.pipeline)
        self.extern: tuple[str, ...] = EXTERN_TEMPLATES  # picks handed over as gemmtune's kernel (inductor.extern)
        self.m: Any = None  # a symbolic M's buckets (inductor.dynamic): its bounds; a range; False: one M
        self.tables: dict[str, str] = {}  # lookup key -> bucketed entry (inductor.dynamic)
        self._pending: list[tuple[str, Any, Any]] = []  # (key, problem, KernelTemplateChoice) awaiting timings
        self.built: list[tuple[str, str, dict]] = []  # (op, template uid, kwargs) handed to Inductor, in order
        self._static = json.dumps(table or {}, sort_keys=True, default=str)
        for key, entries in (table or {}).items():
            self.picks[key] = pick_of_entries(key.rsplit("+", 1)[-1], key, list(entries))

    # -- what Inductor's LookupTableChoices asks ------------------------------------------------
    @staticmethod
    def _get_device_key(device: torch.device) -> str | None:
        if device.type == "cuda" and torch.cuda.is_available():
            return str(torch.cuda.get_device_properties(device.index).gcnArchName)
        return device.type

    def _get_lookup_table(self) -> dict[str, list[dict[str, Any]]]:
        return {k: p.json_entries() for k, p in self.picks.items()}

    def uuid(self) -> str:
        """Part of Inductor's FX-graph cache key (`config.inductor_choices_class`): the options and the settings
        the tunes run under (a graph compiled under other backends or another store is not served)."""
        from ..core.version import __version__
        from .tuning import settings_text

        body = (f"gemmtune {__version__} {self.tune_on_miss} {self.templates} {self.fusion} {self.measure} "
                f"{self.shortlist} {self.gemv} {','.join(self.extern)} {self._static} m={self.m!r} "
                f"{settings_text(self.settings)}" + (" pipeline" if self.pipeline else ""))
        return hashlib.sha256(body.encode()).hexdigest()

    def add(self, pick: InductorPick) -> None:
        self.picks.update(dict.fromkeys(pick.keys, pick))

    def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name,
                                   kwarg_overrides=None):
        if op_name == "scaled_mm":  # Inductor's `tuned_scaled_mm`: answered in inductor/scaled.py
            from .scaled import answer

            return answer(self, template_choices, kernel_inputs, templates, kwarg_overrides)
        if op_name not in OPS:
            return super()._finalize_template_configs(  # type: ignore[misc]
                template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        symbol = dynamic.symbolic_m(kernel_inputs, op_name) if self.m is not False and self.tune_on_miss else None
        bucketed = None if symbol is None else dynamic.answer(self, kernel_inputs, templates, op_name, symbol)
        if bucketed is not None:  # M alone is symbolic: a pick per M bucket (inductor/dynamic.py)
            return bucketed
        key = self.make_lookup_key(kernel_inputs, op_name, include_device=False)  # type: ignore[attr-defined]
        pick = self.picks.get(key) if key else None
        if pick is None and key and self._times_in_inductor(kernel_inputs):
            pick = self._recall_timed(kernel_inputs, op_name, key)
            if pick is None and self.tune_on_miss:  # Inductor times its own candidates, once (inductor/timed.py)
                return self._time_in_inductor(template_choices, kernel_inputs, templates, op_name,
                                              kwarg_overrides, key)
        if pick is None and key and self.tune_on_miss:
            pick = self._tune(kernel_inputs, op_name, key)
        if pick is None:
            self.stats["miss"] += 1
            return self._inductors_own(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        chosen = self._choose(pick, templates, kernel_inputs, op_name)
        if not chosen and _must_answer(pick, op_name):  # e.g. mm with out_dtype: only aten::mm_dtype offered
            self.stats["fallback"] += 1
            return self._inductors_own(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)
        self.stats["hit" if chosen else "empty"] += 1
        if not chosen:
            return []
        self.built += [(op_name, uid, dict(kw)) for uid, kws in chosen.items() for kw in kws]
        return self._create_lookup_choices(chosen, templates, kernel_inputs, op_name)

    def _store(self) -> Any:
        """The store of this handler's settings (where Inductor-timed picks are kept)."""
        from ..core.settings import Settings
        from ..store.locations import store_for

        return store_for(self.settings or Settings.from_env())

    def _times_in_inductor(self, kernel_inputs: Any) -> bool:
        """A GPU problem of a compile that offers Inductor's templates (max-autotune, or the window),
        with `measure="inductor"`: Inductor times its own kernels for it."""
        if self.measure != "inductor" or not (in_window() or _autotuning()):
            return False
        try:
            return kernel_inputs.device().type == "cuda"
        except Exception:  # noqa: BLE001 - not Inductor's kernel inputs (a direct call in a test)
            return False

    def _recall_timed(self, kernel_inputs: Any, op_name: str, key: str) -> InductorPick | None:
        from . import timed
        from .tuning import gemmtune_inputs

        ki = gemmtune_inputs(kernel_inputs, op_name)
        if ki is None:
            return None
        entry = timed.recall(ki, self._store(), inductor_templates().hash_of)
        if entry is None:
            return None
        self.stats["store_hit"] += 1
        pick = InductorPick(op_name, (key,), (entry,), True, "inductor-timed " + str(entry["template_id"]),
                            ki.describe(), None, ki)
        self.picks[key] = pick
        return pick

    def _time_in_inductor(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides, key):
        """Inductor's own list for this call; each candidate is remembered, so that the timings its
        benchmark reports (`on_timings`) are kept in the store under this problem."""
        from .tuning import gemmtune_inputs

        ktcs = list(self._fallback(template_choices, kernel_inputs, templates, op_name, kwarg_overrides))  # type: ignore[attr-defined]
        ki = gemmtune_inputs(kernel_inputs, op_name)
        kept = shortlist_choices(ktcs, ki, self.shortlist, kernel_inputs.device())
        self.stats["shortlisted_out"] += len(ktcs) - len(kept)
        from . import pipeline

        ktcs = pipeline.pipelined(self, kept, in_window() and not _autotuning())  # with the graph's other new ones
        if ki is not None:
            self._pending += [(key, ki, ktc) for ktc in ktcs]
        self.stats["timed_in_inductor"] += 1
        from .timed import listen

        listen()
        return ktcs

    def on_timings(self, timings: Mapping[Any, float]) -> None:
        """Inductor benchmarked a GEMM's choices: keep the timings of those this handler handed it."""
        from . import timed

        groups: dict[str, tuple[Any, list]] = {}
        keep = []
        for key, ki, ktc in self._pending:
            choice = getattr(ktc, "_choice", None)
            if choice is None or choice not in timings:
                keep.append((key, ki, ktc))
                continue
            uid = str(ktc.template.uid)
            entry = {"template_id": uid, **({} if uid.startswith("aten::") else
                                            timed.plain_options(ktc.params.to_kwargs()))}
            if getattr(ktc.template, "src_hash", None) is not None:
                entry["template_hash"] = ktc.template.src_hash
            groups.setdefault(key, (ki, []))[1].append((entry, float(timings[choice])))
        self._pending = keep
        store = self._store()
        timed_all = [t for _, (_, ts) in groups.items() for t in ts]  # addmm: both calls' choices, one winner
        for key, (ki, _) in groups.items():
            kept = timed.remember(ki, timed_all, store)
            if kept is not None:
                self.stats["recorded"] += 1
                self.picks[key] = InductorPick(ki.op, (key,), (kept,), True, "inductor-timed", ki.describe(), None, ki)

    def _inductors_own(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides):
        """What Inductor builds without a pick: its own list; inside the default-mode window, its
        library kernels only (what a default compile builds: nothing benchmarked)."""
        if in_window() and not _autotuning():
            templates = [t for t in templates if str(t.uid).startswith("aten::")]
            template_choices = {uid: g for uid, g in template_choices.items() if str(uid).startswith("aten::")}
        return self._fallback(template_choices, kernel_inputs, templates, op_name, kwarg_overrides)  # type: ignore[attr-defined]

    def _need_to_fix_layout(self, adjusted_choices: list, op_name: str) -> bool:
        """Inside the default-mode window, default mode's rule: a library kernel alone keeps the output
        layout flexible (for mm and addmm), a Triton template fixes it."""
        if not in_window() or _autotuning():
            return super()._need_to_fix_layout(adjusted_choices, op_name)  # type: ignore[misc]
        if any(not str(getattr(c.template, "uid", "")).startswith("aten::") for c in adjusted_choices):
            return True
        from torch._inductor import config

        with config.patch(max_autotune_gemm=False):
            return super()._need_to_fix_layout(adjusted_choices, op_name)  # type: ignore[misc]

    def _create_lookup_choices(self, lookup_results: dict, templates: list, kernel_inputs: Any, op_name: str) -> list:
        """One choice per entry: the template's first heuristic config (derived options such as ACC_TYPE,
        extra kwargs, layout) with the entry's values over it.  Done here rather than by torch's method,
        which in some torch versions uses the entry alone."""
        from torch._inductor.kernel_template_choice import KernelTemplateChoice
        from torch._inductor.template_heuristics.params import DictKernelTemplateParams

        by_uid = {t.uid: t for t in templates}
        out = []
        for uid, configs in lookup_results.items():
            of = by_uid[inductor_templates().aten[op_name]] if uid == EXTERN_UID else by_uid[uid]
            base = next(iter(self.get_ktc(kernel_inputs, of, op_name)), None)  # type: ignore[attr-defined]
            if base is None:  # the heuristic offers nothing for this problem
                continue
            if uid == EXTERN_UID:  # gemmtune's kernel, called by the compiled graph (its library kernel's layout)
                out += [KernelTemplateChoice(template=extern_choice(), params=DictKernelTemplateParams(dict(cfg)),
                                             extra_kwargs={}, layout=base.layout, inputs=kernel_inputs)
                        for cfg in configs]
                continue
            for cfg in configs:
                out.append(KernelTemplateChoice(template=base.template,
                                                params=DictKernelTemplateParams({**base.params.to_kwargs(), **cfg}),
                                                extra_kwargs=base.extra_kwargs, layout=base.layout, inputs=base.inputs))
        return out

    def _choose(self, pick: InductorPick, templates: list, kernel_inputs: Any, op_name: str) -> dict[str, list]:
        """{uid: [config]} for this call: the planned entry (all matching entries when not exact), then
        any companions Inductor is to benchmark; when none matches, a stand-in (`_stand_in`); or
        nothing, when the pick is built in another call."""
        offered = {t.uid: getattr(t, "src_hash", None) for t in templates}
        if inductor_templates().aten.get(op_name) in offered:  # the library call also builds gemmtune's kernel
            offered[EXTERN_UID] = None
        primary, extra = self._planned(pick)
        out: dict[str, list] = {}
        for entry in primary:
            uid = str(entry.get("template_id"))
            if uid not in offered or not self._fresh(entry, uid, offered[uid], op_name, pick):
                continue
            out.setdefault(uid, []).append(_kwargs(entry))
            if pick.exact:
                break
        for entry in extra:  # Inductor weighs fusing the epilogue
            uid = str(entry.get("template_id"))
            if uid in offered and self._fresh(entry, uid, offered[uid], op_name, pick):
                out.setdefault(uid, []).append(_kwargs(entry))
                self.stats["companion"] += 1
        if out and pick.companions and not extra:
            self.stats["fused" if primary is not pick.entries else "unfused"] += 1
        return out or self._stand_in(pick, offered, kernel_inputs, op_name, primary)

    def _planned(self, pick: InductorPick) -> tuple[tuple, tuple]:
        """(entries to build, companions to benchmark beside them) for a pick.  A library pick with
        fusion companions: predicted (`fusion="predict"`, and always in a compile that does not
        autotune, which must benchmark nothing), its best companion alone where the GEMM being lowered
        has an epilogue and fusing it is predicted to gain (`entries.fuse_gain_ms`), else the pick
        alone; a number N in a max-autotune compile: the pick, and N companions to benchmark."""
        if not pick.companions:
            return pick.entries, ()
        if self.fusion != "predict" and _autotuning():
            return pick.entries, tuple(pick.companions[:int(self.fusion)])
        first = pick.companions[0]
        uid = str(first.get("template_id"))
        fresh = first.get("template_hash") in (None, inductor_templates().hash_of(uid))
        gain = fuse_gain_ms(pick) if fresh and has_epilogue(current_node()) else None
        return ((first,), ()) if gain is not None and gain > 0 else (pick.entries, ())

    def _fresh(self, entry: Mapping[str, Any], uid: str, want: Any, op_name: str, pick: InductorPick) -> bool:
        have = entry.get("template_hash")
        if want is not None and have is not None and want != have:
            self.stats["stale"] += 1
            warn_stale(uid, have, want, f"{op_name} {pick.problem or ''}".strip())
            return False
        return True

    def _stand_in(self, pick: InductorPick, offered: dict, kernel_inputs: Any, op_name: str,
                  primary: tuple | None = None) -> dict[str, list]:
        """The planned entries (`primary`, default the pick's) cannot be built by this call's templates:
        their tile on Inductor's plain Triton template (a TMA pick where TMA is not offered), else the
        op's library kernel, unless they are built in a later call of the same op (addmm's Triton call)."""
        primary = pick.entries if primary is None else primary
        t = inductor_templates()
        plain = t.triton_bmm if op_name == "bmm" else t.triton_mm
        tiles = [e for e in primary if "BLOCK_M" in e and e.get("template_id") != plain]  # not a stale one
        if tiles and plain in offered:
            self.stats["tile_stand_in"] += 1
            entry = dict(tiles[0], template_id=plain, template_hash=offered[plain])
            return {plain: [_kwargs(entry)]}
        aten = t.aten.get(op_name)
        if aten is not None and aten in offered and not self._elsewhere(primary, op_name, kernel_inputs):
            self.stats["library_stand_in"] += 1
            return {aten: [{}]}
        return {}

    @staticmethod
    def _elsewhere(primary: tuple, op_name: str, kernel_inputs: Any) -> bool:
        """addmm asks its Triton templates in a later call: a Triton entry is built there when Inductor
        offers Triton templates for this output (the test tuned_addmm makes)."""
        if op_name != "addmm" or all(str(e.get("template_id", "")).startswith("aten::") for e in primary):
            return False
        try:
            from torch._inductor.utils import use_triton_template

            return bool(use_triton_template(kernel_inputs.output_layout(), check_max_autotune=False))
        except Exception:  # noqa: BLE001 - an Inductor without this helper: keep the library kernel
            return False

    def _tune(self, kernel_inputs: Any, op_name: str, key: str) -> InductorPick | None:
        from .tuning import tune_inductor_problem

        try:
            tuned = tune_inductor_problem(kernel_inputs, op_name, self.settings, self.templates, self.fusion,
                                          self.extern)
        except Exception as exc:  # noqa: BLE001 - Inductor's own choices are a safe answer
            log.warning("gemmtune.inductor: tuning %s failed (%s: %s); Inductor chooses", op_name,
                        type(exc).__name__, exc)
            self.stats["tune_failed"] += 1
            return None
        if tuned is None:
            return None
        pick, from_store = tuned
        self.stats["tuned"] += 1
        self.stats["store_hit"] += from_store
        self.add(pick)
        self.picks[key] = pick  # whatever our key reconstruction says, this call's key is this pick's
        return pick


