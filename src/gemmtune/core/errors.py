"""Typed errors raised by gemmtune.

Every error names the argument and the problem so the caller can fix the call
without reading gemmtune's source.
"""

from __future__ import annotations


class GemmtuneError(Exception):
    """Base class of every error gemmtune raises on purpose."""


class InputError(GemmtuneError, ValueError):
    """The tensors or scalars given to an op are not a valid GEMM problem."""


class SettingsError(InputError):
    """A setting has a bad value: the message names the `Settings` argument, or the `GEMMTUNE_*`
    variable and its field when the value came from the environment.  (Unknown strategy or backend
    names stay `BackendError`.)"""


class BackendError(GemmtuneError, ValueError):
    """An unknown backend family or strategy name was requested."""


class NoCandidatesError(GemmtuneError, RuntimeError):
    """No candidate kernel could be built (or survived compile and checks)."""


class LayoutError(GemmtuneError, ValueError):
    """An output layout was requested that the selection cannot honour."""


class IsolationUnavailable(GemmtuneError, RuntimeError):
    """`isolation="subprocess"` was asked for but the candidates cannot be sent to a worker process
    (e.g. a template class defined inside a function cannot be pickled)."""


class LookupTableError(InputError):
    """A lookup table or `gemmtune cache import` file is malformed: the message names the file, the
    entry and what is wrong.  Raised when the file is loaded, before anything is tuned or written."""


class StoreUnavailableError(GemmtuneError, RuntimeError):
    """A store that had to answer (the `gemmtune cache` commands) did not, or refused the call: the
    message names the store (its printable location) and the cause.  Nothing was kept in this
    process's memory instead, as a tune would (exit 2 from the CLI)."""


class InductorUnavailable(GemmtuneError, RuntimeError):
    """The installed torch has no Inductor lookup table (`torch._inductor.lookup_table`, in torch builds
    from late 2025 on): `gemmtune.inductor` cannot feed Inductor.  The message names the torch version."""


class SettingsWarning(UserWarning):
    """A `GEMMTUNE_*` environment variable that gemmtune does not read (a misspelt setting): the
    message names it and the closest real setting.  Given once per variable per process."""
