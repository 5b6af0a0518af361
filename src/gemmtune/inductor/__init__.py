"""Feed Inductor gemmtune's picks, as entries of Inductor's own GEMM lookup table.

Two ways (docs/MODELS.md):

- `install()`: a choices handler for `torch.compile` (a subclass of the installed torch's
  `LookupTableChoices`): every mm/addmm/bmm Inductor lowers is looked up, tuned by gemmtune on a
  miss, and Inductor builds only the pick: it benchmarks nothing and still fuses epilogues.
- `export_table()` / `table_for()` / `gemmtune inductor-table`: a JSON table for torch's stock
  `torch._inductor.config.lookup_table.table` with `LookupTableChoices` (CUDA only in torch).

Example:
    >>> import torch, gemmtune.inductor as gi
    >>> if gi.available():
    ...     with gi.installed(tune_on_miss=True) as handler:
    ...         f = torch.compile(lambda a, b: (a @ b).relu(), mode="max-autotune-no-cudagraphs", fullgraph=True)
    ...         y = f(torch.randn(64, 32), torch.randn(32, 16))   # doctest: +SKIP
"""

from ..core.errors import InductorUnavailable
from .compat import available, inductor_templates, require
from .entries import InductorPick, Measured, entries_for
from .export import drop_stale, export_table, read_table, table_for, tuned_picks, write_table
from .installer import benchmark_probe, install, installed, uninstall
from .keys import problem_keys
from .outside import tune_wanted
from .tuning import pick_for_selection

__all__ = [
    "InductorPick", "InductorUnavailable", "Measured", "available", "benchmark_probe", "drop_stale", "entries_for",
    "export_table", "inductor_templates", "install", "installed", "pick_for_selection", "problem_keys", "require",
    "read_table", "table_for", "tune_wanted", "tuned_picks", "uninstall", "write_table",
]
