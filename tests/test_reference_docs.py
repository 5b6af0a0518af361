"""The generated reference pages (docs/CLI.md, docs/API.md, docs/SETTINGS.md's tables) are what
`make docs` (tools/docs.py) renders from today's code, cover every command, option and public name,
and read well: deterministic, no terminal-width dependence, no machine paths or object reprs."""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import re
import shutil
from pathlib import Path

import pytest

import gemmtune
import gemmtune.inductor
from gemmtune.cli.parser import build_parser
from gemmtune.cli.reference import cli_reference, wrap
from gemmtune.offline.simulate import _parser as simulate_parser

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gemmtune_docs_tool", ROOT / "tools" / "docs.py")
docs_tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs_tool)

STALE = "{page} is out of date with the code: run `make docs` (python tools/docs.py) and commit it"
needs_pdoc = pytest.mark.skipif(
    importlib.util.find_spec("pdoc") is None,
    reason="pdoc is not installed (the dev and docs extras bring it): docs/API.md unchecked")


@pytest.fixture(scope="module")
def api_page() -> str:
    import api_doc  # tools/, put on the path by tools/docs.py

    return api_doc.api_reference()


def _sections(page: str, level: str) -> dict[str, str]:
    """{heading name: its text up to the next heading of that level} for headings `## `name``."""
    parts = re.split(rf"^{level} `([^`]+)`$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _prose(page: str) -> list[str]:
    """The page's lines outside fenced blocks and tables."""
    lines, fenced = [], False
    for line in page.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and not line.startswith(("```", "|")):
            lines.append(line)
    return lines


# -- the committed pages are current ---------------------------------------------------------------------------

def test_the_committed_cli_page_is_what_the_parser_renders_now():
    assert (ROOT / "docs" / "CLI.md").read_text() == cli_reference(), STALE.format(page="docs/CLI.md")


def test_the_committed_settings_tables_are_what_the_specs_render_now():
    current = (ROOT / "docs" / "SETTINGS.md").read_text()
    assert docs_tool.settings_page(current) == current, STALE.format(page="docs/SETTINGS.md")


@needs_pdoc
def test_the_committed_api_page_is_what_the_docstrings_render_now(api_page):
    assert (ROOT / "docs" / "API.md").read_text() == api_page, STALE.format(page="docs/API.md")


@needs_pdoc
def test_the_check_exits_1_naming_the_stale_page_and_writes_nothing(tmp_path, monkeypatch, capsys):
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "SETTINGS.md", tmp_path / "docs")  # its prose around the generated tables
    monkeypatch.setattr(docs_tool, "ROOT", tmp_path)
    assert docs_tool.main([]) == 0 and docs_tool.main(["--check"]) == 0  # written, then current
    stale = (tmp_path / "docs" / "CLI.md").read_text().replace("--shape SHAPE", "--shape S")
    (tmp_path / "docs" / "CLI.md").write_text(stale)
    capsys.readouterr()
    assert docs_tool.main(["--check"]) == 1
    assert capsys.readouterr().err.splitlines() == ["docs/CLI.md is out of date: run `make docs`"]
    assert (tmp_path / "docs" / "CLI.md").read_text() == stale


# -- coverage --------------------------------------------------------------------------------------------------

def _parsers() -> dict[str, argparse.ArgumentParser]:
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    found = {"gemmtune": top, **{f"gemmtune {n}": p for n, p in sub.choices.items()}}
    found["gemmtune simulate"] = simulate_parser()  # simulate parses its own arguments
    return found


def test_every_command_and_option_of_the_parser_is_in_the_cli_page():
    sections = _sections((ROOT / "docs" / "CLI.md").read_text(), "##")
    parsers = _parsers()
    assert list(sections) == list(parsers)
    for name, parser in parsers.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help is argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):
                assert all(f"`gemmtune {c}`" in sections[name] or c in sections[name] for c in action.choices)
                continue
            for option in action.option_strings:
                assert re.search(rf"^\| `[^`]*{re.escape(option)}\b", sections[name], re.M), (name, option)
            if action.help:
                assert " ".join(action.help.split()).replace("|", "\\|") in sections[name], (name, action.dest)
            if action.choices:
                assert "{" + ",".join(map(str, action.choices)) + "}" in sections[name], (name, action.dest)


def _parameters(obj) -> list[str]:
    try:
        return list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return []


@needs_pdoc
def test_every_public_name_is_in_the_api_page_with_its_signature(api_page):
    sections = _sections(api_page, "###")
    for module in (gemmtune, gemmtune.inductor):
        for name in module.__all__:
            obj = getattr(module, name)
            heading = next((h for h in (f"{module.__name__}.{name}", f"gemmtune.{name}") if h in sections), None)
            assert heading is not None and getattr(gemmtune if heading.count(".") == 1 else module, name) is obj, \
                f"{module.__name__}.{name} has no section in docs/API.md"
            code = sections[heading].split("```python\n", 1)[1].split("```", 1)[0]
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                assert code.startswith(f"class {name}("), name
                continue
            for param in _parameters(obj):
                assert re.search(rf"\b{param}\b", code), f"{heading}: parameter {param} missing from its signature"


# -- determinism and readability -------------------------------------------------------------------------------

def test_the_cli_page_does_not_depend_on_the_terminal_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli_reference()
    monkeypatch.setenv("COLUMNS", "250")
    assert cli_reference() == narrow == cli_reference()


@needs_pdoc
def test_rendering_the_api_page_twice_gives_the_same_page(api_page):
    import api_doc

    assert api_doc.api_reference() == api_page


@pytest.mark.parametrize("page", ["CLI.md", pytest.param("API.md", marks=needs_pdoc)])
def test_a_generated_page_says_so_first_and_holds_no_machine_path_or_object_repr(page, request):
    text = cli_reference() if page == "CLI.md" else request.getfixturevalue("api_page")
    assert "generated by `make docs`" in text.splitlines()[0]
    assert not re.search(r"0x[0-9a-f]{6,}|<factory>|<function |<class |object at |/home/|/work/|/tmp/|site-packages",
                         text)
    long = [line for line in _prose(text) if len(line) > 100]
    assert long == []


def test_prose_wraps_without_starting_a_line_that_markdown_would_read_as_a_list_or_quote():
    text = "x " * 30 + "- not a list item, > not a quote, # not a heading " + "y " * 40
    for width in range(20, 70):
        lines = wrap(text, width=width)
        assert all(len(line) <= width or line.split()[-1] in "->#" for line in lines)
        assert not any(re.match(r"[-+*>#] ", line) for line in lines)
        assert " ".join(lines).split() == text.split()


@needs_pdoc
def test_a_docstring_example_becomes_a_python_session_and_its_doctest_flags_are_dropped():
    import api_doc

    md = api_doc.markdown("Do it.\n\nExample:\n    >>> f(1)  # doctest: +SKIP\n    2\n")
    assert md == ["Do it.", "", "**Example:**", "", "```pycon", ">>> f(1)", "2", "```"]
