"""GPU picks timed on Inductor's own kernels, once, and kept in gemmtune's store.

gemmtune's `triton_mm` is not Inductor's mm template: the same tile runs at another speed in
Inductor's code (for nn.Linear's column-major weight, by up to 1.7x on the H200), so a pick timed on
gemmtune's kernel is not the best choice for a kernel Inductor builds.  On a GPU the handler therefore
lets Inductor time its own candidates for a problem the store does not know, once, with epilogue
benchmarking off (the timings come back while the GEMM is lowered); a feedback saver on Inductor's
algorithm selector (`select_algorithm.add_feedback_saver`) hands them to the handler, which keeps them
here: one row per candidate (template `inductor:<uid>`, its options as the config, its ms) and the
fastest as the pick, under the problem's key tagged `inductor-timed`.  A later compile, in this
process or another that shares the store, builds that pick alone and benchmarks nothing.  An entry
whose template source changed is not used (the row keeps the template's `src_hash`).

Example:
    >>> import torch
    >>> from gemmtune.store.sqlite import Store
    >>> from gemmtune.core.inputs import TensorMeta
    >>> meta = lambda size, stride: TensorMeta(size, stride, torch.bfloat16, "cuda:0")
    >>> ki = KernelInputs("mm", (meta((64, 32), (32, 1)), meta((32, 16), (1, 32))))
    >>> s = Store(":memory:")
    >>> remember(ki, [({"template_id": "aten::mm"}, 0.02), ({"template_id": "triton::mm", "BLOCK_M": 64}, 0.01)],
    ...          s, env="e")
    {'template_id': 'triton::mm', 'BLOCK_M': 64}
    >>> recall(ki, s, env="e", current_hash=lambda uid: None)
    {'template_id': 'triton::mm', 'BLOCK_M': 64}
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from ..core.choices import Choice, Timing, as_params
from ..core.inputs import KernelInputs
from ..store.keys import Row
from ..store.rows import to_row, to_timing
from ..store.sqlite import Store, env_info, env_key

__all__ = ["TAG", "problem_of", "remember", "recall", "plain_options", "listen", "feedback"]

log = logging.getLogger("gemmtune")

TAG = "inductor-timed"
PREFIX = "inductor:"


def problem_of(ki: KernelInputs) -> str:
    """The store key of a problem's Inductor-timed pick."""
    return f"{ki.problem_key}|out=row|{TAG}"


def _env(ki: KernelInputs, env: str | None) -> tuple[str, dict]:
    info = env_info(ki.device) if env is None else {}
    return (env_key(info) if env is None else env), info


def plain_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A template's options as a JSON-safe entry (values that are not plain numbers, strings or
    booleans are left to the template's own heuristic when the entry is built again)."""
    return {k: v for k, v in kwargs.items() if isinstance(v, (bool, int, float, str)) or v is None}


def remember(ki: KernelInputs, timed: Sequence[tuple[dict[str, Any], float]], store: Store,
             env: str | None = None) -> dict[str, Any] | None:
    """Keep Inductor's timings of a problem's candidates (entries with `template_id`) and return the
    stored pick's entry (the fastest, or one a racing process stored first)."""
    ok = [(e, ms) for e, ms in timed if ms is not None and ms == ms and ms != float("inf")]
    if not ok:
        return None
    env_s, info = _env(ki, env)
    rows = [to_row(_timing(entry, ms)) for entry, ms in ok]
    best = min(rows, key=lambda r: r.ms or 0.0)
    stored = store.save(env_s, info, problem_of(ki), ki.describe(), rows, best, replace_pick=False)
    return _entry(stored)


def _timing(entry: dict[str, Any], ms: float) -> Timing:
    """Inductor's timing of one entry, as the Timing of a choice named by its template id."""
    opts = {k: v for k, v in entry.items() if k not in ("template_id", "template_hash")}
    return Timing(Choice(PREFIX + str(entry["template_id"]), entry.get("template_hash"), as_params(opts)), float(ms),
                  "inductor")


def _entry(row: Row) -> dict[str, Any]:
    choice = to_timing(row).choice
    entry = {"template_id": choice.template_uid[len(PREFIX):], **choice.config_dict}
    if choice.src_hash is not None:
        entry["template_hash"] = choice.src_hash
    return entry


def recall(ki: KernelInputs, store: Store, current_hash: Callable[[str], Any], env: str | None = None
           ) -> dict[str, Any] | None:
    """The stored pick's entry for this problem; None when there is none or its template changed."""
    env_s, _ = _env(ki, env)
    pick = store.load(env_s, problem_of(ki)).pick
    if pick is None or not pick.template.startswith(PREFIX):
        return None
    entry = _entry(pick)
    want = current_hash(entry["template_id"])
    if want is not None and entry.get("template_hash") not in (None, want):
        return None
    return entry


def feedback(timings: Any, *rest: Any) -> None:
    """Inductor's feedback saver: the timings of one GEMM's benchmark go to the active gemmtune
    handler (`V.choices`), when it handed Inductor those choices."""
    from torch._inductor.virtualized import V

    handler: Any = V.choices
    if not getattr(handler, "_pending", None):
        return
    try:
        handler.on_timings(timings)
    except Exception as exc:  # noqa: BLE001 - not kept: the compile goes on, the next one times again
        log.warning("gemmtune.inductor: Inductor's timings not kept (%s: %s)", type(exc).__name__, exc)
        handler.stats["record_failed"] += 1


def listen() -> None:
    """Register `feedback` with Inductor's algorithm selector (once per selector: it can be rebuilt)."""
    from torch._inductor import select_algorithm

    getter = getattr(select_algorithm, "get_algorithm_selector_cache", None)
    cache = getter() if getter else getattr(select_algorithm, "_ALGORITHM_SELECTOR_CACHE", None)
    if cache is None or feedback not in getattr(cache, "feedback_saver_fns", []):
        select_algorithm.add_feedback_saver(feedback)
