"""`gemmtune cache ls|show|clear|export|import`: the store's management commands."""

from __future__ import annotations

import argparse
import re

from rich.console import Console

from ..core.errors import InputError
from ..core.settings import Settings

__all__ = ["cmd_cache"]


def console() -> Console:
    """The CLI's stdout console (`cli.out`, set up by `configure_consoles`)."""
    from . import out

    return out


def cmd_cache(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ..store.locations import shared_store
    from ..store.trust import Trust
    from ..report import write_json
    from ..store.lookup import import_file

    settings = Settings.from_env(store=args.store)
    location, trust = settings.store, Trust.of(settings)
    if args.action in ("import", "clear"):  # an effect that must last: never on a fall-back in memory
        import warnings

        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            store = shared_store(location, trust)
        if store.path == ":memory:" and store.origin != ":memory:":
            why = store.warnings[-1] if store.warnings else "it could not be opened"
            raise InputError(f"cache {args.action}: nothing was changed: "
                             f"{re.split('; (?:left it untouched and )?keeping', why)[0]}")
    else:
        store = shared_store(location, trust)
    if args.action == "ls":
        table = Table(title=f"gemmtune store {store.path}")
        for col in ("problem", "device", "pick", "ms", "timings"):
            table.add_column(col, overflow="fold")
        for p in store.problems():
            rt = " ".join(f"{k}={v}" for k, v in p["runtime_params"].items())
            cfg = ",".join(f"{k}={v}" for k, v in p["config"].items())
            table.add_row(p["problem"], str(p["env_info"].get("device")), f"{p['template']} {cfg} {rt}".strip(),
                          f"{p['ms']:.4f}" if p["ms"] is not None else "-", str(p["timings"]))
        console().print(table)
    elif args.action == "show":
        console().print_json(data=store.show(args.arg or ""))
    elif args.action == "clear":
        console().print(f"cleared {store.clear()} picks from {store.path}")
    elif args.action == "export":
        if not args.arg:
            raise ValueError("cache export: give the JSON file to write")
        data = store.export()
        write_json(data, args.arg)
        console().print(f"exported {len(data['entries'])} picks to {args.arg}")
    elif args.action == "import":
        if not args.arg:
            raise ValueError("cache import: give the JSON file to read")
        console().print(f"imported {import_file(store, args.arg)} picks into {store.path}")
    return 0
