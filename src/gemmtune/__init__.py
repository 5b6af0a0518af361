"""gemmtune: a GEMM autotuner for PyTorch.

`import gemmtune` is cheap: the public names load on first use (PEP 562), so the `gemmtune` command
imports only what its subcommand needs (`gemmtune --help` imports no torch).  The
`torch.ops.gemmtune.*` operators are registered when a `torch.compile` trace first meets a gemmtune
GEMM, or on `import gemmtune.dispatch.library`; eager use never needs them.

Example:
    >>> import torch, gemmtune
    >>> sel = gemmtune.tune("mm", torch.randn(64, 32), torch.randn(32, 16))
    >>> print(gemmtune.autotune_table(sel))  # doctest: +SKIP
"""

import importlib as _importlib
import os as _os
from typing import Any as _Any

from .core.version import __version__

_EXPORTS = {
    "core.choices": ("Choice", "Selection", "Timing"),
    "core.errors": ("BackendError", "GemmtuneError", "InductorUnavailable", "InputError", "IsolationUnavailable",
                    "LayoutError", "NoCandidatesError"),
    "templates.heuristics": ("add_finalize_hook", "get_template_configs"),
    "core.inputs": ("KernelInputs",),
    "core.validate": ("ProblemTooLargeError",),
    "core.layout": ("FixedLayout", "FlexibleLayout"),
    "report": ("autotune_table", "selection_dict"),
    "core.settings": ("FAMILIES", "Settings"),
    "engine": ("tune",),
    "store.distributed": ("DistributedTuneError", "distributed_group"),
    "dispatch": ("WarmupReport", "addmm", "bmm", "clear_dispatch_cache", "dispatch_stats", "mm", "patch", "scaled_mm",
                 "tune_buckets", "tune_wanted_buckets", "unpatch", "warmup"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> _Any:
    """A public name on first use (its module is imported then); a sub-package or module by its name."""
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        return value
    if not name.startswith("_"):
        try:
            return _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _inductor_handler() -> bool:
    """A gemmtune GEMM traced for Inductor: make sure Inductor builds gemmtune's picks."""
    from .inductor.installer import ensure_installed

    return ensure_installed()


# A benchmark worker (gemmtune.measure.worker, a fresh interpreter) needs only the layers below the
# dispatch: it installs no Inductor hook.
if _os.environ.get("GEMMTUNE_WORKER_PROCESS") != "1":
    from .core import hooks as _hooks

    _hooks.INDUCTOR.append(_inductor_handler)
