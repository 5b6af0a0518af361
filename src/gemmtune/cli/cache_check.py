"""`gemmtune cache check`: every entry of a store read through the store's schema (`store.entry`).

One line per bad entry (the store, the key, why), then a summary.  Exit status: 0 when every entry is
good, 1 when bad entries were found, 2 when the store cannot be read (raised by the caller's checks:
a store that fell back to memory, a Redis server that does not answer).
"""

from __future__ import annotations

from typing import Any

__all__ = ["check"]


def check(store: Any, out: Any) -> int:
    """Check `store` and print the verdict on the console `out`; returns the exit status (0 or 1).

    Example:
        >>> from rich.console import Console
        >>> from gemmtune.store.sqlite import Store
        >>> check(Store(":memory:"), Console(width=200))
        :memory:: checked 0 entries: all good
        0
    """
    n, bad = store.check()
    for key, why in bad:
        out.print(f"{store.path}: {key}: {why}", markup=False, emoji=False, highlight=False, soft_wrap=True)
    signer = store.trust.signer
    how = f" (signatures under key {signer.key_id})" if signer is not None else ""
    verdict = f"{len(bad)} bad (skipped by every reader; a new tune replaces them)" if bad else "all good"
    out.print(f"{store.path}: checked {n} entries{how}: {verdict}", markup=False, emoji=False, highlight=False, soft_wrap=True)
    return 1 if bad else 0
