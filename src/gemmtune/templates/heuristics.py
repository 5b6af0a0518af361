"""get_template_configs: the one heuristics call per op.

Every active template contributes its candidates in one call, so an override
(lookup table, model, user hook) installed as a finalize hook sees all of them
at once.  The output layout is decided here, after the hooks ran.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..core.choices import Choice
from ..core.inputs import KernelInputs
from ..core.layout import FixedLayout, FlexibleLayout
from .base import Template

FinalizeHook = Callable[[KernelInputs, list[Choice], str], list[Choice]]
"""`hook(kernel_inputs, choices, op_name) -> choices`: may filter, reorder or pin."""

_HOOKS: list[FinalizeHook] = []


def add_finalize_hook(hook: FinalizeHook) -> Callable[[], None]:
    """Install a global finalize hook; returns a function that removes it.

    Example:
        >>> remove = add_finalize_hook(lambda ki, choices, op: [c for c in choices if c.is_extern])
        >>> remove()
    """
    _HOOKS.append(hook)
    return lambda: _HOOKS.remove(hook) if hook in _HOOKS else None


def output_layout(ki: KernelInputs, choices: Sequence[Choice]) -> FlexibleLayout | FixedLayout:
    """Flexible while every choice is a library kernel; fixed (row-major) once a template competes."""
    flexible = FlexibleLayout(ki.out_size, ki.result_dtype, ki.device)
    return flexible if all(c.is_extern for c in choices) else flexible.fix()


def get_template_configs(kernel_inputs: KernelInputs, templates: Sequence[Template], op_name: str,
                         finalize: Sequence[FinalizeHook] = ()) -> list[Choice]:
    """Every candidate of every template for one op, with its output layout set.

    Example:
        >>> import torch
        >>> from gemmtune.templates.extern import AtenTemplate
        >>> ki = KernelInputs.from_tensors("mm", torch.ones(4, 4), torch.ones(4, 4))
        >>> [c.layout.kind for c in get_template_configs(ki, [AtenTemplate("mm")], "mm")]
        ['flexible']
    """
    choices: list[Choice] = []
    for template in templates:
        choices.extend(template.configs(kernel_inputs))
    for hook in (*_HOOKS, *finalize):
        choices = list(hook(kernel_inputs, choices, op_name))
    layout = output_layout(kernel_inputs, choices)
    return [c.with_layout(layout) for c in choices]
