"""The in-model check's verdicts kept in the store, so a warm store's warm-up need not time them again.

`warmup`'s in-model check (`dispatch.in_model`) times the model's forward with each generated pick
and with torch's op: about 0.3 s on a GPU for a few picks, the largest part of a warm-store warm-up
once the picks' kernels come from the store too.  Its verdicts depend on the model, the picks and the
machine, so they are kept under a digest of all three (`verdict_key`):

- every GEMM problem the recording forward met, with its call count and its pick (template, config,
  runtime params and source hash), torch's op included: the picks decide what the model runs;
- the model's class and the classes of its modules, in order (a model built of other layers around
  the same GEMMs runs another forward);
- the device environment of its problems (the store's env key: device name, driver and library
  versions), and the host's CPU model and torch's thread count (the check weighs host launch cost);
- `Settings.library_margin`, which the check applies.

A warm-up whose key is found applies the kept verdicts (a pick the check sent to torch's op goes
there again) and times nothing.  `warmup(in_model=True)` checks again and keeps the new verdicts,
which later warm-ups read (the newest wins).  They live in the store beside the shared kernels
(`kernel_files` under the key `in_model:DIGEST`), so `gemmtune cache clear` removes them too.
What is read there is untrusted input, parsed strictly (`parse_rows`): anything malformed is not
found, said in one line naming the store and the key, and the warm-up checks again.

Example:
    >>> from gemmtune.store.sqlite import Store
    >>> store = Store(":memory:")
    >>> keep(store, "K", [InModel("mm(1x8, 8x8)", "triton_gemv", 1.2, True, 1.1)], ["mm|1x8|8x8"])
    >>> [v.kept for v in kept(store, "K").values()], kept(store, "other")
    ([True], None)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import re
import time
from typing import Any, Sequence

import torch

from .in_model import InModel

__all__ = ["verdict_key", "kept", "keep", "matching", "parse_rows", "PREFIX"]

log = logging.getLogger("gemmtune")
PREFIX = "in_model:"
_FIELDS = tuple(f.name for f in dataclasses.fields(InModel))
_LAST = [0]  # the time stamp of this process's last kept verdicts (ns)
FILE = re.compile(r"verdicts-\d{20}\.json")  # what `keep` names a file
MAX_BYTES, MAX_ROWS = 1 << 20, 4096
_TYPES = {"problem_key": str, "problem": str, "winner": str, "ratio": float, "kept": bool, "q1": float,
          "together": bool}
_NEEDED = {"problem_key", "problem", "winner", "ratio", "kept"}


def verdict_key(model: Any, problems: Sequence[tuple[str, Any, int]], margin: float) -> str | None:
    """The digest the verdicts of `model`'s check are kept under; `problems`: each recorded problem's
    description, Selection (None where it has none: an empty or fp8 problem) and call count.  None
    where nothing is known of the device (no tuned problem).

    Example:
        >>> verdict_key(object(), [], 0.01) is None
        True
    """
    from ..store.env import cpu_model
    from ..store.keys import env_info, env_key

    parts, envs = [], set()
    for describe, sel, calls in problems:
        if sel is None:
            parts.append(f"{describe}|{calls}|-")
            continue
        w = sel.winner
        parts.append(f"{sel.problem.problem_key}|{calls}|{w.key}|{w.src_hash}")
        envs.add(str(sel.problem.device))
    if not envs:
        return None
    modules = getattr(model, "modules", None)
    tree = ",".join(type(m).__qualname__ for m in modules()) if callable(modules) else ""
    head = [type(model).__module__ + "." + type(model).__qualname__, tree, f"margin={margin!r}",
            f"host={cpu_model()}|threads={torch.get_num_threads()}", *sorted(env_key(env_info(d)) for d in envs)]
    return hashlib.sha256("\n".join(head + sorted(parts)).encode()).hexdigest()[:32]


def kept(store: Any, key: str) -> dict[tuple[str, str], InModel] | None:
    """The newest verdicts kept under `key`, by (problem key, winner), marked as read from the store;
    None when there are none (or the store keeps no files, or what it holds cannot be read)."""
    read = getattr(store, "kernel_files", None)
    if read is None:
        return None
    files = {name: data for name, data in read(PREFIX + key).items() if FILE.fullmatch(name)}
    if not files:
        return None
    rows = parse_rows(files[max(files)])
    if isinstance(rows, str):
        log.warning("gemmtune.warmup: store %s: the kept in-model verdicts under %s%s could not be read (%s); "
                    "checking again", getattr(store, "path", "?"), PREFIX, key, rows)
        return None
    return {(row["problem_key"], row["winner"]): dataclasses.replace(
        InModel(**{k: row[k] for k in _FIELDS if k in row}), stored=True) for row in rows}


def parse_rows(data: bytes) -> list[dict[str, Any]] | str:
    """The verdict rows `keep` writes, read strictly (`_TYPES`: those keys only, times finite and not
    negative, bounded in size), or why they are not.

    Example:
        >>> parse_rows(b'[{"problem_key": "p", "problem": "mm", "winner": "w", "ratio": 1.5, "kept": true}]')[0]["ratio"]
        1.5
        >>> parse_rows(b'[{"problem_key": "p", "problem": "mm", "winner": "w", "ratio": "fast", "kept": true}]')
        'row 0: ratio is not a number'
    """
    if len(data) > MAX_BYTES:
        return f"more than {MAX_BYTES} bytes"
    try:
        rows = json.loads(data)
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(rows, list) or len(rows) > MAX_ROWS:
        return f"not a list of at most {MAX_ROWS} rows"
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not _NEEDED <= set(row) <= set(_TYPES):
            return f"row {i}: not an object of the keys {sorted(_TYPES)}"
        for name, value in row.items():
            want = _TYPES[name]
            if want is float and (type(value) not in (int, float) or not math.isfinite(value) or value < 0):
                return f"row {i}: {name} is not a number"
            if want is not float and type(value) is not want:
                return f"row {i}: {name} is not a {want.__name__}"
    return rows


def keep(store: Any, key: str, verdicts: Sequence[InModel], problem_keys: Sequence[str]) -> None:
    """Keep `verdicts` (one per problem key of `problem_keys`) under `key` (a store without files keeps
    nothing)."""
    put = getattr(store, "put_kernel_files", None)
    if put is None:
        return
    rows = [{**{k: v for k, v in dataclasses.asdict(verdict).items() if k != "stored"}, "problem_key": pk}
            for verdict, pk in zip(verdicts, problem_keys)]
    _LAST[0] = max(time.time_ns(), _LAST[0] + 1)  # strictly newer than this process's last, whatever the clock's tick
    put(PREFIX + key, {f"verdicts-{_LAST[0]:020d}.json": json.dumps(rows).encode()})


def matching(found: dict[tuple[str, str], InModel] | None, switches: Sequence[Any]) -> list[InModel] | None:
    """The kept verdict of each switch, in order, where every switch's problem and pick has one; else None.

    Example:
        >>> matching({}, []), matching(None, [])
        ([], None)
    """
    if found is None:
        return None
    keys = [(sw.selection.problem.problem_key, sw.selection.winner.name) for sw in switches]
    return [found[k] for k in keys] if all(k in found for k in keys) else None
