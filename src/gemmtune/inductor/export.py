"""Lookup tables for Inductor: from Selections, from the gemmtune store, to and from JSON.

A table is `{key: [entry, ...]}`, the format of `torch._inductor.config.lookup_table.table`: keys
from `keys.problem_keys`, entries from `entries.entries_for`.

The store keys a problem by a hash of its sizes, strides, dtypes and scalars, and keeps only its
sizes in clear (`describe`); `store_picks` recovers each problem by hashing the layouts it can have
(A and B row- or column-major, a contiguous bias, alpha = beta = 1) and keeping the one that matches.
A problem stored with other strides or scalars is skipped and counted.

Example:
    >>> import torch, gemmtune
    >>> from gemmtune.inductor import available
    >>> sel = gemmtune.tune("mm", torch.randn(16, 8), torch.randn(8, 4), backends=("extern",),
    ...                     settings=gemmtune.Settings(store="off"))
    >>> list(table_for([sel]).values()) if available() else [[{'template_id': 'aten::mm'}]]
    [[{'template_id': 'aten::mm'}]]
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..core.errors import LookupTableError
from ..core.inputs import KernelInputs, TensorMeta, parse_dtype
from .compat import inductor_templates
from ..store.rows import to_timing
from .entries import InductorPick, entries_for, mm_companion
from .handler import warn_stale
from .keys import mm_keys, problem_keys
from .tuning import pick_for_selection

log = logging.getLogger("gemmtune")

__all__ = ["table_for", "tuned_picks", "export_table", "store_picks", "read_table", "write_table", "drop_stale", "StoreExport"]

_DESCRIBE = re.compile(r"^(mm|addmm|bmm)\((.*)\)$")


def table_for(items: Iterable[Any], few: int = 2) -> dict[str, list[dict[str, Any]]]:
    """A lookup table from Selections (`gemmtune.tune`) and/or `InductorPick`s; later items win a key.

    Example:
        >>> import torch, gemmtune
        >>> sel = gemmtune.tune("bmm", torch.randn(2, 8, 4), torch.randn(2, 4, 3), backends=("extern",))  # doctest: +SKIP
        >>> table_for([sel])  # doctest: +SKIP
        {'((torch.float32, [2, 8, 4], [32, 4, 1]), (torch.float32, [2, 4, 3], [12, 3, 1]))+bmm': [{'template_id': 'aten::bmm'}]}
    """
    by_key: dict[str, InductorPick] = {}
    for item in items:
        pick = item if isinstance(item, InductorPick) else pick_for_selection(item, few=few)
        for key in pick.keys:
            by_key[key] = pick
    return {k: p.json_entries() for k, p in with_companions(by_key).items()}


def with_companions(by_key: dict[str, InductorPick]) -> dict[str, InductorPick]:
    """`by_key` plus, for each addmm, its plain mm's key where no mm pick is known (`mm_companion`)."""
    out = dict(by_key)
    for pick in list(by_key.values()):
        ki = pick.inputs
        if ki is None:
            continue
        keys = tuple(k for k in mm_keys(ki) if k not in out)
        companion = mm_companion(ki, pick, keys) if keys else None
        if companion is not None:
            out.update({k: companion for k in keys})
    return out


# -- from the store --------------------------------------------------------------------------------

@dataclass(frozen=True)
class StoreExport:
    """What `export_table` made of a store: the table, the picks behind it, the problems it skipped."""

    table: dict
    picks: tuple[InductorPick, ...]
    skipped: tuple[str, ...]  # "describe: why"


def _layouts(size: tuple[int, ...], role: str) -> list[tuple[int, ...]]:
    """The strides a stored operand can have: contiguous, or (for A and B) its transpose's."""
    if len(size) == 1:
        return [(1,)]
    rows, cols = size[-2], size[-1]
    batch = (rows * cols,) if len(size) == 3 else ()
    out = [(*batch, cols, 1)]
    if role != "bias":
        out.append((*batch, 1, rows))
    return out


def _candidates(op: str, sizes: list[tuple[int, ...]], dtype: Any, device: str) -> Iterable[KernelInputs]:
    roles = ["bias", "a", "b"] if op == "addmm" else ["a", "b"]
    for strides in itertools.product(*(_layouts(s, r) for s, r in zip(sizes, roles))):
        metas = tuple(TensorMeta(s, st, dtype, device) for s, st in zip(sizes, strides))
        yield KernelInputs(op, metas, 1.0, 1.0)


def recover_problem(problem_key: str, describe: str) -> KernelInputs | None:
    """The KernelInputs behind a stored problem key, or None when no plain layout hashes to it.

    Example:
        >>> import torch
        >>> ki = KernelInputs.from_tensors("mm", torch.randn(8, 4), torch.randn(2, 4).t())
        >>> recover_problem(ki.problem_key, ki.describe()) == ki
        True
    """
    base = problem_key.split("|")[0]
    m = _DESCRIBE.match(describe or "")
    parts = base.split("/")
    if not m or len(parts) < 3:
        return None
    try:
        dtype = parse_dtype(parts[-2])
        sizes = [tuple(int(n) for n in s.split("x")) for s in m.group(2).split(", ")]
    except (ValueError, LookupTableError):
        return None
    for device in ("cuda:0", "cpu"):
        for ki in _candidates(m.group(1), sizes, dtype, device):
            if ki.problem_key == base:
                return ki
    return None


def store_picks(store: Any, device: str | None = None, few: int = 2) -> StoreExport:
    """Every pick in `store` (a gemmtune Store) as Inductor entries; `device` ("cuda"/"cpu") filters."""
    by_key: dict[str, InductorPick] = {}
    skipped: list[str] = []
    for p in store.problems():
        if "|out=col" in p["problem"]:
            continue  # Inductor's key does not say the output layout: the row-major pick speaks for it
        ki = recover_problem(p["problem"], p.get("describe") or "")
        if ki is None:
            skipped.append(f"{p.get('describe') or p['problem']}: strides or scalars not recoverable from the store")
            continue
        if device is not None and ki.device_type != device:
            continue
        stored = store.load(p["env"], p["problem"])
        if stored.pick is None:
            continue
        timings = [to_timing(r) for r in stored.rows if r.status == "ok"]
        pick = entries_for(ki, to_timing(stored.pick).choice, timings, few=few, keys=problem_keys(ki))
        if p["problem"].endswith("|traced") and any(k in by_key for k in pick.keys):
            continue  # the plain pick (all templates) wins over the traced one (traceable templates)
        for key in pick.keys:
            by_key[key] = pick
    picks = tuple({id(p): p for p in by_key.values()}.values())
    return StoreExport({k: p.json_entries() for k, p in with_companions(by_key).items()}, picks, tuple(skipped))


def export_table(store: Any = None, device: str | None = None, few: int = 2) -> StoreExport:
    """The lookup table of a gemmtune store (default: the settings' store), with what was skipped.

    Example:
        >>> import gemmtune.inductor as gi
        >>> out = gi.export_table("memory")            # doctest: +SKIP
        >>> json.dumps(out.table)                      # doctest: +SKIP
        '{}'
    """
    from ..engine import shared_store
    from ..core.settings import Settings

    if store is None or isinstance(store, (str, Path)):
        store = shared_store(Settings.from_env(store=str(store) if store is not None else None).store)
    return store_picks(store, device, few)


def tuned_picks(problems: Iterable[tuple[str, Sequence[Any]]], settings: Any = None, templates: str = "inductor",
                few: int = 2) -> list[InductorPick]:
    """Tune each `(op, tensors)` among the templates Inductor can build (the store answers known ones,
    under the same key the installed handler uses) and return their Inductor entries."""
    from ..core.settings import Settings
    from ..engine import tune
    from .tuning import inductor_pool

    settings = settings or Settings.from_env()
    out = []
    for op, tensors in problems:
        pool = inductor_pool(tensors[-1].device.type, templates, settings)
        sel = tune(op, *tensors, settings=settings, templates=pool, store_tag="inductor")
        out.append(pick_for_selection(sel, few=few))
    return out


# -- JSON, and entries gone stale ----------------------------------------------------------------

def read_table(source: str | Path | Mapping[str, Any]) -> dict[str, list]:
    """A table from a JSON file or a dict (`{key: [entries]}`), checked: LookupTableError when malformed."""
    name = f"inductor table {source}" if isinstance(source, (str, Path)) else "inductor table"
    data: Any = source
    if isinstance(source, (str, Path)):
        try:
            data = json.loads(Path(source).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LookupTableError(f"{name}: cannot read it as JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise LookupTableError(f"{name}: expected {{key: [entries]}}, got {type(data).__name__}")
    for key, entries in data.items():
        if not isinstance(entries, list) or not all(isinstance(e, Mapping) and "template_id" in e for e in entries):
            raise LookupTableError(f"{name}: key {key!r}: expected a list of entries with a 'template_id'")
    return {k: [dict(e) for e in v] for k, v in data.items()}


def drop_stale(table: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, list]:
    """`table` without the entries whose template_hash differs from the installed torch's template
    (each dropped with a RuntimeWarning); keys left with no entry go too.

    Example:
        >>> import gemmtune.inductor as gi
        >>> stale = {"k+mm": [{"template_id": "triton::mm", "template_hash": "old"}]}
        >>> gi.drop_stale(stale) if gi.available() else {}   # doctest: +SKIP
        {}
    """
    table = read_table(table)  # LookupTableError for anything but {key: [entries with a template_id]}
    hashes = inductor_templates().hashes
    out: dict[str, list] = {}
    for key, entries in table.items():
        kept = []
        if not entries:
            warnings.warn(f"gemmtune: inductor table key {key!r} has no entries; it pins nothing", RuntimeWarning,
                          stacklevel=2)
        for e in entries:
            if e["template_id"] not in hashes:
                warnings.warn(f"gemmtune: inductor table key {key!r}: template_id {e['template_id']!r} is not one of "
                              f"this torch's GEMM templates ({', '.join(sorted(map(str, hashes)))}); Inductor "
                              "will never match it", RuntimeWarning, stacklevel=2)
            want, have = hashes.get(e.get("template_id")), e.get("template_hash")
            if want is not None and have is not None and want != have:
                warn_stale(str(e.get("template_id")), have, want, key.rsplit("+", 1)[-1])
                continue
            kept.append(dict(e))
        if kept:
            out[key] = kept
    return out


def write_table(table: Mapping[str, Any], path: str | Path) -> None:
    """Write `table` as JSON (sorted keys, one entry list per key)."""
    Path(path).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
