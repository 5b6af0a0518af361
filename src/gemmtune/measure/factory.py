"""`runner_for`: the runner `Settings.isolation` asks for, with the in-process fallback."""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import torch

from ..core.choices import Choice
from ..core.errors import IsolationUnavailable
from ..core.inputs import KernelInputs
from ..templates.base import Launcher, Template
from .isolation import SubprocessRunner
from .runners import Runner, local_runner

log = logging.getLogger("gemmtune")


def runner_for(isolation: str, settings: Any, ki: KernelInputs, tensors: Sequence[torch.Tensor],
               templates: Mapping[str, Template], out_layout: str | None,
               launchers: Callable[[Choice], Launcher]) -> Runner:
    """A subprocess runner for `isolation="subprocess"` (already resolved from "auto"), else in-process.

    Where isolation is unavailable (templates that cannot be sent to a worker), an explicit
    `settings.isolation == "subprocess"` raises IsolationUnavailable; "auto" warns and measures
    in this process.  `launchers` gives the in-process runner its binaries.

    Example:
        >>> import torch, gemmtune
        >>> a, b = torch.randn(8, 4), torch.randn(4, 6)
        >>> ki = KernelInputs.from_tensors("mm", a, b)
        >>> runner_for("off", gemmtune.Settings(), ki, (a, b), {}, None, None).isolation
        'off'
    """
    if isolation == "subprocess":
        try:
            return SubprocessRunner(ki, tensors, templates, settings, out_layout)
        except IsolationUnavailable as exc:
            if settings.isolation == "subprocess":  # asked for explicitly: do not run unisolated
                raise
            log.warning("gemmtune: %s; measuring in this process", exc)
    return local_runner(ki, tensors, launchers, settings, out_layout)
