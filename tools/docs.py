"""Write the generated reference pages: docs/SETTINGS.md's table, docs/CLI.md and docs/API.md.

    python tools/docs.py           # write them (`make docs` runs this)
    python tools/docs.py --check   # write nothing; exit 1 naming each page that is out of date

docs/SETTINGS.md: its table, between the `<!-- settings-table -->` markers, from the settings' specs
(`gemmtune.core.settings_doc`); the prose around it is written by hand.  docs/CLI.md: from the
command line's parsers (`gemmtune.cli.reference`).  docs/API.md: from the docstrings and signatures
of the public Python API (`tools/api_doc.py`), with pdoc's doc model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # api_doc, beside this file

SETTINGS_START, SETTINGS_END = "<!-- settings-table -->", "<!-- /settings-table -->"


def settings_page(current: str) -> str:
    """docs/SETTINGS.md with the table between its markers rendered anew (the prose kept)."""
    from gemmtune.core.settings_doc import settings_table

    head, found, rest = current.partition(SETTINGS_START)
    _, found_end, tail = rest.partition(SETTINGS_END)
    if not (found and found_end):
        raise SystemExit(f"docs/SETTINGS.md: the {SETTINGS_START} ... {SETTINGS_END} markers are missing")
    return f"{head}{SETTINGS_START}\n{settings_table()}{SETTINGS_END}{tail}"


def cli_page(current: str) -> str:
    from gemmtune.cli.reference import cli_reference

    return cli_reference()


def api_page(current: str) -> str:
    from api_doc import api_reference

    return api_reference()


PAGES: dict[str, Callable[[str], str]] = {
    "docs/SETTINGS.md": settings_page, "docs/CLI.md": cli_page, "docs/API.md": api_page,
}


def stale_pages(root: Path) -> dict[str, str]:
    """{page: its text as rendered now} for each generated page whose file differs (or is missing)."""
    stale = {}
    for page, render in PAGES.items():
        path = root / page
        current = path.read_text() if path.is_file() else ""
        text = render(current)
        if text != current:
            stale[page] = text
    return stale


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/docs.py", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming each page that differs from what would be written")
    args = p.parse_args(argv)
    stale = stale_pages(ROOT)
    for page, text in stale.items():
        if args.check:
            print(f"{page} is out of date: run `make docs`", file=sys.stderr)
        else:
            (ROOT / page).write_text(text)
            print(f"wrote {page} ({len(text.splitlines())} lines)")
    if not stale:
        print("the generated pages are current: " + ", ".join(PAGES))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
