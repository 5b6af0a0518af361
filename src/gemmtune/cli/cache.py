"""`gemmtune cache ls|show|clear|export|import`: the store's management commands."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from typing import Any, Iterator

from rich.console import Console

from ..core.errors import InputError, StoreUnavailableError
from ..core.settings import Settings

__all__ = ["cmd_cache"]


def console() -> Console:
    """The CLI's stdout console (`cli.out`, set up by `configure_consoles`)."""
    from . import out

    return out


def cmd_cache(args: argparse.Namespace) -> int:
    from ..store.locations import store_for

    settings = Settings.from_env(store=args.store)
    if args.action in ("import", "clear", "check"):  # an effect that must last, or a verdict: never on a fall-back
        import warnings

        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            store = store_for(settings)
        if store.path == ":memory:" and store.origin != ":memory:":
            why = store.warnings[-1] if store.warnings else "it could not be opened"
            done = "the store cannot be read" if args.action == "check" else "nothing was changed"
            raise InputError(f"cache {args.action}: {done}: "
                             f"{re.split('; (?:left it untouched and )?keeping', why)[0]}")
    else:
        store = store_for(settings)
    with answering(store, args.action):
        return run_action(args, store)


@contextlib.contextmanager
def answering(store: Any, action: str) -> Iterator[None]:
    """Every call of `action` reaches `store`: a Redis store that does not answer, or refuses, is a
    StoreUnavailableError naming it and the cause (exit 2, one line), never a fall-back in memory."""
    strictly = getattr(store, "strictly", None)
    if strictly is None:  # a SQLite store: the fall-back in memory is caught when it is opened
        yield
        return
    try:
        with strictly():
            yield
    except StoreUnavailableError as exc:
        done = ("not every pick was written (the import can be run again: it writes the same picks)"
                if action == "import" else "nothing was done")
        raise StoreUnavailableError(f"cache {action}: {exc}; {done}") from None


def run_action(args: argparse.Namespace, store: Any) -> int:
    """`gemmtune cache ACTION` on an opened store."""
    from rich.table import Table

    from ..report import write_json
    from ..store.lookup import import_file

    if args.action == "ls":
        problems = store.problems()
        if not problems:
            console().print(f"the store {store.path} holds no picks", markup=False, highlight=False)
            return 0
        table = Table(title=f"gemmtune store {store.path}")
        for col in ("problem", "device", "pick", "ms", "timings"):
            table.add_column(col, overflow="fold")
        for p in problems:
            rt = " ".join(f"{k}={v}" for k, v in p["runtime_params"].items())
            cfg = ",".join(f"{k}={v}" for k, v in p["config"].items())
            op, _, rest = p["problem"].partition("/")  # the shapes whole on a line of their own, the rest folded
            table.add_row(f"{op}/\n{rest}" if rest else op, str(p["env_info"].get("device")), f"{p['template']} {cfg} {rt}".strip(),
                          f"{p['ms']:.4f}" if p["ms"] is not None else "-", str(p["timings"]))
        console().print(table)
        from .cache_families import family_table

        if (buckets := family_table(problems)) is not None:  # the families tuned at several M
            console().print(buckets)
    elif args.action == "show":
        from .cache_show import show

        return show(store, args.arg or "", console(), as_json=args.json)
    elif args.action == "clear":
        return clear(store, args.yes)
    elif args.action == "export":
        if not args.arg:
            raise ValueError("cache export: give the JSON file to write")
        data = store.export()
        write_json(data, args.arg)
        console().print(f"exported {len(data['entries'])} picks to {args.arg}")
    elif args.action == "check":
        from .cache_check import check

        return check(store, console())
    elif args.action == "import":
        if not args.arg:
            raise ValueError("cache import: give the JSON file to read")
        console().print(f"imported {import_file(store, args.arg)} picks into {store.path}")
    return 0


def clear(store: Any, yes: bool) -> int:
    """`gemmtune cache clear`: asks first where stdin is a terminal ("clear N picks from STORE? [y/N]"),
    else needs `--yes`: without it nothing is deleted (an InputError, exit 2).  Returns the exit
    status: 0 when cleared, 1 when the answer was not yes."""
    if not yes:
        n = len(store.problems())
        if not _is_terminal(sys.stdin):
            raise InputError(f"cache clear: {store.path} holds {n} picks; stdin is not a terminal to ask, "
                             "so nothing was deleted (pass --yes to clear them)")
        sys.stderr.write(f"clear {n} picks from {store.path}? [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            console().print("nothing was cleared", highlight=False)
            return 1
    console().print(f"cleared {store.clear()} picks from {store.path}", markup=False, highlight=False)
    return 0


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no stdin, or a closed one
        return False
