"""A store you share is a store you check: whatever a shared store answers runs in a process only
after it passed the correctness gate there.

A shared store (`store.shared`: a Redis store, a SQLite file another user owns or may write, any
store under `Settings.store_shared="on"`) holds entries other processes and machines wrote: a bug,
another driver or a hostile writer can leave a pick naming a kernel that computes something else, or
a wrong kernel's timing row marked ok with a tiny time.  Stored timings may rank candidates, but the
choice that wins (a stored pick, a timing from the store) is run once on the tune's operands and its
output compared with the float64 reference (`measure.correctness`), as at tune time, before it
decides or serves anything (`gate`; the engine and `pipeline.steps` call it on every path).  An entry
that fails is dropped from the store with a warning naming the store and the key (`drop`), and the
problem is decided again among the rest; one that passes is not checked again in this process.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Sequence

import torch

from ..measure.correctness import check, reference
from ..core.inputs import KernelInputs
from .keys import Row

log = logging.getLogger("gemmtune")


def wrong_output(ki: KernelInputs, run: Callable[[], torch.Tensor], tensors: Sequence[torch.Tensor]) -> str | None:
    """Why `run()`'s output is not the op on `tensors` (against the float64 reference), else None.

    Example:
        >>> a, b = torch.randn(4, 3), torch.randn(3, 2)
        >>> ki = KernelInputs.from_tensors("mm", a, b)
        >>> wrong_output(ki, lambda: a @ b, (a, b)) is None, wrong_output(ki, lambda: a @ b + 1, (a, b))[:14]
        (True, 'relative error')
    """
    with torch.no_grad():
        return check(ki, run(), reference(ki, tensors))


def checked_here(store: Any, env: str, problem: str, entry: Row) -> bool:
    """Whether `entry`'s choice already passed the gate in this process (or `store` is not shared)."""
    return not getattr(store, "shared", False) or (env, problem, *entry.choice_key, entry.src_hash) in _checked(store)


def gate(store: Any, env: str, problem: str, entry: Row, fault: Callable[[], str | None], describe: str) -> str | None:
    """None when `store` is not shared, `entry`'s choice passed the gate in this process before, or
    `fault()` (the choice run and checked) finds nothing; else the reason, after dropping the entry
    from the store with a warning (`drop`).

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> shared = Store(":memory:"); shared.shared = True
        >>> pick = Row("aten_mm", None, "{}", "{}", 1.0, "ok")
        >>> gate(shared, "env", "p", pick, lambda: None, "mm") is None, checked_here(shared, "env", "p", pick)
        (True, True)
        >>> import warnings; warnings.simplefilter("ignore")
        >>> gate(shared, "env", "q", pick, lambda: "relative error 1.0", "mm")
        'relative error 1.0'
    """
    if checked_here(store, env, problem, entry):
        return None
    try:
        why = fault()
    except Exception as exc:  # a kernel that fails to run is no more correct than one that computes garbage
        why = f"it failed to run: {type(exc).__name__}: {str(exc).strip()[:200]}"
    if why is None:
        _checked(store).add((env, problem, *entry.choice_key, entry.src_hash))
        return None
    drop(store, env, problem, entry, why, describe)
    return why


def drop(store: Any, env: str, problem: str, entry: Row, why: str, describe: str) -> None:
    """Forget a stored entry found wrong in this process (its timing row and the problem's pick), with a
    warning that names the store and the key."""
    msg = (f"{describe}: the store {getattr(store, 'path', store)} holds {entry.template} {entry.config} "
           f"{entry.runtime} as a correct kernel under key {problem!r}, but it gave a wrong result ({why}); "
           f"dropped it and the problem's pick from the store, deciding again")
    log.warning("gemmtune: %s", msg)
    warnings.warn(f"gemmtune: {msg}", RuntimeWarning, stacklevel=4)
    store.forget(env, problem, entry)


def _checked(store: Any) -> set:
    return store.__dict__.setdefault("checked", set())
