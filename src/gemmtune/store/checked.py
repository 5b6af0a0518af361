"""A store you share is a store you check: a pick read from a shared store is run once per process
against the float64 reference before it serves anything.

A shared store (`store.shared`: the Redis store) holds picks other machines wrote: a bug, another
driver or a hostile writer can leave an entry naming a kernel that computes something else.  So the
first time a process takes a pick from one, the kernel runs on the tune's operands and its output
goes through the correctness gate (`measure.correctness`), as at tune time.  A pick that fails is
dropped from the store with a warning and the problem is tuned again; one that passes is not checked
again in this process.
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


def first_use_fault(store: Any, env: str, problem: str, pick: Row, run: Callable[[], torch.Tensor],
                    ki: KernelInputs, tensors: Sequence[torch.Tensor]) -> str | None:
    """None when `store` is not shared, the pick was checked in this process, or `run()` matches the
    reference; else the reason, after dropping the pick from the store with a warning.

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> a, b = torch.randn(4, 3), torch.randn(3, 2)
        >>> ki = KernelInputs.from_tensors("mm", a, b)
        >>> shared = Store(":memory:"); shared.shared = True
        >>> pick = Row("aten_mm", None, "{}", "{}", 1.0, "ok")
        >>> first_use_fault(shared, "env", "p", pick, lambda: a @ b, ki, (a, b)) is None
        True
        >>> import warnings; warnings.simplefilter("ignore")
        >>> first_use_fault(shared, "env", "q", pick, lambda: a @ b + 1, ki, (a, b))[:14]
        'relative error'
    """
    if not getattr(store, "shared", False):
        return None
    checked = store.__dict__.setdefault("checked", set())
    key = (env, problem, pick.choice_key, pick.src_hash)
    if key in checked:
        return None
    with torch.no_grad():
        why = check(ki, run(), reference(ki, tensors))
    if why is None:
        checked.add(key)
        return None
    msg = (f"{ki.describe()}: the shared store {store.path}'s pick {pick.template} {pick.config} gave a wrong "
           f"result ({why}); dropped it from the store, tuning again")
    log.warning("gemmtune: %s", msg)
    warnings.warn(f"gemmtune: {msg}", RuntimeWarning, stacklevel=4)
    store.forget(env, problem, pick)
    return why
