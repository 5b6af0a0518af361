"""The `gemmtune` command's argument helpers that need no console: errors that name flags, `--store`'s
directory check, negative values joined to their flag."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import InputError

__all__ = ["FLAGS", "check_store_arg", "flag_named", "join_negative_values"]


FLAGS = {"top_x": "--top-x", "budget_s": "--budget-s", "report_rows": "--rows", "backends": "--backends",
         "strategy": "--strategy", "effort": "--effort", "isolation": "--isolation", "store": "--store",
         "lookup_table": "--lookup-table", "dtype": "--dtype", "gpus": "--gpus",
         "scales": "--scales", "b_layout": "--b-layout"}
"""Settings fields (and the dtype check) by the `gemmtune` flag that sets them: errors name the flag."""


def flag_named(message: str) -> str:
    """An error about a field set by a flag, naming the flag instead.

    Example:
        >>> flag_named("top_x: must be >= 1, got 0"), flag_named("GEMMTUNE_TOP_X (top_x): must be >= 1")
        ('argument --top-x: must be >= 1, got 0', 'GEMMTUNE_TOP_X (top_x): must be >= 1')
    """
    field, sep, rest = message.partition(": ")
    return f"argument {FLAGS[field]}: {rest}" if sep and field in FLAGS else message


def check_store_arg(store: str | None) -> None:
    """`--store PATH`: its directory must exist (a typo must not create a tree of directories).

    Example:
        >>> check_store_arg("memory"), check_store_arg(None)
        (None, None)
        >>> check_store_arg("/nonexistent/dir/x.sqlite")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: argument --store: directory /nonexistent/dir does not exist (create it first, or use --store memory)
    """
    if store is None or store.strip().lower() in ("memory", "off", ":memory:", "default") or "://" in store:
        return  # a keyword, or a URL (the store setting checks its scheme)
    parent = Path(store).expanduser().parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise InputError(f"argument --store: directory {parent} {why} (create it first, or use --store memory)")


def join_negative_values(argv: list[str]) -> list[str]:
    """`--shape -5x4x4` as `--shape=-5x4x4`, so that the value is checked (argparse takes it for an option).

    Example:
        >>> join_negative_values(["tune", "--shape", "-5x4x4", "--batch", "-2", "-v"])
        ['tune', '--shape=-5x4x4', '--batch=-2', '-v']
    """
    joined: list[str] = []
    i = 0
    while i < len(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i].startswith("--") and "=" not in argv[i] and len(nxt) > 1 and nxt[0] == "-" and nxt[1] in "0123456789.":
            joined.append(f"{argv[i]}={nxt}")
            i += 2
        else:
            joined.append(argv[i])
            i += 1
    return joined
