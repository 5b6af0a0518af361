"""Overrides that see every candidate of an op at once (finalize hooks).

- `LookupTable`: problem -> pinned choices, from a JSON file, a dict, or the
  output of `gemmtune cache export` ("tune once, ship the table").
- `ChoiceHook`: subclass and implement `select()` to filter, reorder or pin.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.choices import Choice
from ..core.inputs import KernelInputs
from ..core.errors import LookupTableError
from .schema import check_export, check_table, unknown_templates
from .sqlite import canon

log = logging.getLogger("gemmtune")


class ChoiceHook:
    """Base class for user hooks: `select` gets every candidate of one op.

    Example:
        >>> class LibraryOnly(ChoiceHook):
        ...     def select(self, ki, choices, op_name):
        ...         return [c for c in choices if c.is_extern]
        >>> # gemmtune.tune("mm", a, b, finalize=[LibraryOnly()])
    """

    def select(self, ki: KernelInputs, choices: list[Choice], op_name: str) -> list[Choice]:
        return choices

    def __call__(self, ki: KernelInputs, choices: list[Choice], op_name: str) -> list[Choice]:
        return list(self.select(ki, choices, op_name))


def _entry_key(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    return (entry["template"], canon(entry.get("config", {})), canon(entry.get("runtime_params", {})))


class LookupTable(ChoiceHook):
    """Pins choices per problem.  A hit narrows the candidates to the pinned ones (no search).

    `entries` maps a problem key (`KernelInputs.problem_key`, optionally with
    an `|out=row` suffix as the store writes it) to a list of
    `{template, src_hash, config, runtime_params}`.  Entries whose `src_hash`
    no longer matches the template's source are dropped with a warning.

    Example:
        >>> table = LookupTable({"mm(8x4, 4x2)/float32/abc": [{"template": "aten_mm", "src_hash": None}]})
        >>> len(table)
        1
    """

    def __init__(self, entries: Mapping[str, Sequence[Mapping[str, Any]]]):
        self.entries: dict[str, list[Mapping[str, Any]]] = {}
        for problem, pins in entries.items():
            self.entries.setdefault(problem.split("|out=")[0], []).extend(pins)
        self.stale: list[str] = []
        self.unknown: list[str] = []  # load-time warnings: pins naming templates gemmtune does not ship

    def __len__(self) -> int:
        return len(self.entries)

    @classmethod
    def load(cls, source: str | Path | Mapping[str, Any]) -> "LookupTable":
        """From a JSON file path or a dict: either `{problem: [pins]}` or a `gemmtune cache export`.

        Checked completely here (`gemmtune.store.schema`): a malformed file raises `LookupTableError`
        naming the file and the entry; a pin naming an unknown template is a warning.  Never written.
        """
        data, name = source, "lookup table"
        if not isinstance(source, Mapping):
            name = f"lookup table {source}"
            data = read_json(source, name)
        table = check_table(data, name)
        obj = cls(table)
        obj.unknown = unknown_templates(table, name)
        return obj

    def select(self, ki: KernelInputs, choices: list[Choice], op_name: str) -> list[Choice]:
        pins = self.entries.get(ki.problem_key)
        if not pins:
            return choices
        by_key = {(c.template_uid, canon(c.config), canon(c.runtime)): c for c in choices}
        kept = []
        for pin in pins:
            c = by_key.get(_entry_key(pin))
            if c is None:
                continue
            if c.src_hash != pin.get("src_hash"):
                msg = (f"lookup table entry for {ki.describe()} pins {c.key} measured with source "
                       f"{str(pin.get('src_hash'))[:12]}, but the template's source is now "
                       f"{str(c.src_hash)[:12]}: entry dropped")
                self.stale.append(msg)
                warnings.warn(f"gemmtune: {msg}", RuntimeWarning, stacklevel=2)
                continue
            kept.append(c)
        return kept or choices


def read_json(path: str | Path, name: str) -> Any:
    """The JSON document in `path` (read only); LookupTableError when it cannot be read or parsed."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LookupTableError(f"{name}: cannot read it as JSON: {exc}") from exc


def import_file(store: Any, path: str) -> int:
    """`gemmtune cache import`: the file is read (never written) and checked completely before anything is
    stored; a malformed one is a LookupTableError naming the file and the entry (exit 2, one line).
    Returns how many picks `store` took."""
    name = f"cache import {path}"
    data = read_json(path, name)
    check_export(data, name, need_env=True)
    unknown_templates({e["problem"]: [e["pick"]] for e in data["entries"]}, name, strict=True)  # nothing unusable
    try:
        return store.import_(data, name)
    except (KeyError, TypeError) as exc:  # a value the checks let through that the store cannot hold
        raise LookupTableError(f"{name}: {type(exc).__name__}: {exc}") from exc
