"""gemmtune's own kernel as an Inductor extern call, for a pick Inductor cannot build.

A CUTLASS pick (`cutlass_operators`) has no Inductor template: Inductor's CUTLASS
backend generates C++ from `cutlass_library` and compiles it with nvcc, so it cannot build the CuTe
DSL kernels of NVIDIA's operators library.  Handed to Inductor as its closest Triton kernels, the
pick's speed is lost.  Here the handler hands Inductor one `ExternKernelChoice` instead,
`extern_kernels.gemmtune_pick`: the compiled graph calls gemmtune's kernel for that pick, writing into
the buffer Inductor allocates (an out variant, as Inductor's `aten::mm` is), nothing benchmarked.

The entry is `{"template_id": "aten::gemmtune_pick", "pick": "<op>;<alpha>;<beta>;<choice key>"}`.  Its
kernel is the one gemmtune compiled for the problem when it tuned it (`register`); a process that
lacks it (a graph loaded from Inductor's cache) tunes the problem once on the call's own tensors,
which the store answers.  `EXTERN_TEMPLATES` are the templates handled this way by default
(`install(extern=...)` changes them).

Example:
    >>> pick_text("mm", 1.0, 0.0, "cutlass_operators_tile128x256[]")
    'mm;1.0;0.0;cutlass_operators_tile128x256[]'
    >>> parse_pick('mm;1.0;0.0;cutlass_operators_tile128x256[]')
    ('mm', 1.0, 0.0, 'cutlass_operators_tile128x256[]')
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any, Callable

import torch

from ..core.binding import first_call_binding

__all__ = ["EXTERN_NAME", "EXTERN_UID", "EXTERN_TEMPLATES", "pick_text", "parse_pick", "register", "run_pick",
           "write_into", "kernel_choice", "extern_choice", "STATS"]

log = logging.getLogger("gemmtune")

EXTERN_NAME = "gemmtune_pick"
EXTERN_UID = "aten::" + EXTERN_NAME  # Inductor names an ExternKernelChoice "aten::<name>"
EXTERN_TEMPLATES: tuple[str, ...] = ("cutlass_operators",)
STATS: Counter = Counter()  # "registered", "calls", "retuned", "retuned_from_store", "differs"

_Key = tuple[str, tuple]
_KERNELS: dict[_Key, Callable[..., torch.Tensor]] = {}
_LOCK = threading.Lock()


def pick_text(op: str, alpha: float, beta: float, choice_key: str) -> str:
    """The `pick` of an extern entry: everything the call needs beside its tensors."""
    return f"{op};{float(alpha)!r};{float(beta)!r};{choice_key}"


def parse_pick(pick: str) -> tuple[str, float, float, str]:
    """(op, alpha, beta, choice key) of a `pick_text`; ValueError naming the text when it is not one."""
    parts = pick.split(";", 3)
    if len(parts) != 4:
        raise ValueError(f"gemmtune extern: not a pick: {pick!r}")
    try:
        return parts[0], float(parts[1]), float(parts[2]), parts[3]
    except ValueError:
        raise ValueError(f"gemmtune extern: not a pick: {pick!r}") from None


def _signature(tensors: tuple[torch.Tensor, ...]) -> tuple:
    """What a kernel is compiled for, read off a call's tensors (every call: nothing converted)."""
    return tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)


def register(pick: str, operands: Any, kernel: Callable[..., torch.Tensor]) -> None:
    """Keep the kernel gemmtune compiled for a pick and its problem (`operands`: its TensorMetas)."""
    sig = tuple((torch.Size(m.size), tuple(m.stride), m.dtype, torch.device(m.device)) for m in operands)
    with _LOCK:
        _KERNELS[(pick, sig)] = first_call_binding(kernel)  # bound on its first call, as the tuner timed it
    STATS["registered"] += 1


def handler_settings() -> tuple[Any, str]:
    """(settings, templates) of the installed handler (Inductor's choices class), else the environment's
    settings and the templates Inductor builds ("inductor")."""
    from ..core.settings import Settings

    from torch._inductor import config

    handler = getattr(config.inductor_choices_class, "handler", None)  # `installer.HandlerFactory`
    return (getattr(handler, "settings", None) or Settings.from_env(),
            str(getattr(handler, "templates", None) or "inductor"))


def _retune(pick: str, tensors: tuple[torch.Tensor, ...]) -> Callable[..., torch.Tensor]:
    """The kernel of a pick this process did not tune: the problem tuned on the call's tensors (the
    store answers it), with the pool the handler tunes with; a warning when its pick differs."""
    from ..engine import tune
    from ..templates.registry import settings_pool

    op, alpha, beta, key = parse_pick(pick)
    settings = handler_settings()[0]
    with torch.no_grad():
        sel = tune(op, *tensors, settings=settings, templates=settings_pool(settings),
                   store_tag="inductor", alpha=alpha, beta=beta)
    STATS["retuned"] += 1
    STATS["retuned_from_store"] += bool(sel.cache_hit)
    if sel.winner.key != key:
        STATS["differs"] += 1
        log.warning("gemmtune extern: %s: the compiled graph asks for %s, the store's pick is %s: running that",
                    sel.problem.describe(), key, sel.winner.key)
    if sel.kernel is None:
        raise RuntimeError(f"gemmtune extern: {sel.problem.describe()}: the tune gave no kernel to run")
    return first_call_binding(sel.kernel)


def run_pick(*tensors: torch.Tensor, pick: str, out: torch.Tensor) -> torch.Tensor:
    """What the compiled graph calls: the pick's kernel on `tensors`, written into `out`."""
    sig = (pick, _signature(tensors))
    kernel = _KERNELS.get(sig)
    if kernel is None:
        with _LOCK:
            kernel = _KERNELS.get(sig)
            if kernel is None:
                kernel = _KERNELS[sig] = _retune(pick, tensors)
    STATS["calls"] += 1
    return write_into(out, kernel, tensors)


def write_into(out: torch.Tensor, kernel: Callable[..., torch.Tensor], tensors: tuple) -> torch.Tensor:
    """`kernel(*tensors)` written into Inductor's buffer `out`: directly where it is contiguous, else
    through a fresh row-major result (a layout the kernel does not write)."""
    if out.is_contiguous():
        return kernel(*tensors, out=out)
    out.copy_(kernel(*tensors))
    return out


def kernel_choice(fn: Callable[..., torch.Tensor], name: str) -> Any:
    """Inductor's `ExternKernelChoice` named `name` calling `fn` with an out variant, made once per process
    (Inductor keeps one per name, as `extern_kernels.<name>`)."""
    from torch._inductor.select_algorithm import ExternKernelChoice, extern_kernels

    found = _made.get(name)
    if found is None:
        if hasattr(extern_kernels, name):  # left by an earlier copy of this module (a reload)
            delattr(extern_kernels, name)
        found = _made[name] = ExternKernelChoice(fn, name=name, has_out_variant=True)
    return found


def extern_choice() -> Any:
    """Inductor's `ExternKernelChoice` for `run_pick`."""
    return kernel_choice(run_pick, EXTERN_NAME)


_made: dict[str, Any] = {}
