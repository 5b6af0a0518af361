"""Which way a traced `gemmtune.mm` / `addmm` / `bmm` (or a patched layer) goes under `torch.compile`.

With `Settings.compile_path="inductor"` (the default) a static-shape call's traced op
(`dispatch.compiled`) becomes the plain aten op when AOTAutograd traces through it, and Inductor
builds gemmtune's pick for it through the installed choices handler
(`gemmtune.inductor`), in every compile mode: one integration for every GEMM of a compiled model,
its backward GEMMs included.  `HOOKS` install that handler; `gemmtune/__init__.py` registers the
installer in `gemmtune.core.hooks` (this layer does not import `gemmtune.inductor`).  A call the handler cannot honour
(a `backends=` restriction, an `out_layout`), symbolic sizes, or `compile_path="traced"` takes the
traced path of `dispatch.compiled` instead, and a torch without Inductor's lookup table too.

Example:
    >>> import torch
    >>> to_inductor((torch.randn(2, 3), torch.randn(3, 4)), backends=("extern",), out_layout=None)
    False
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..core.hooks import INDUCTOR
from ..core.settings import Settings

__all__ = ["HOOKS", "to_inductor"]

HOOKS: list[Callable[[], bool]] = INDUCTOR
"""Each makes sure Inductor asks gemmtune for its GEMMs; True when it does (False: no lookup table)."""

def _static(tensors: Sequence[torch.Tensor]) -> bool:
    return all(type(s) is int for t in tensors for s in (*t.shape, *t.stride()))


def to_inductor(tensors: Sequence[torch.Tensor], backends: object, out_layout: str | None) -> bool:
    """Whether this traced call goes to Inductor as the aten op (see the module docstring); makes
    sure the handler is installed when it does."""
    if backends is not None or out_layout is not None or not _static(tensors):
        return False
    if Settings.from_env().compile_path != "inductor" or not HOOKS:
        return False
    return all(hook() for hook in HOOKS)
