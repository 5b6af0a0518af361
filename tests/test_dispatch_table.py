"""The dispatch table (`gemmtune.dispatch.table`): one object owns the eager dispatch's runners,
Selections, counters, hooks, recorder and lock, and no module reaches into another dispatch
module's private names."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
import torch

import gemmtune
from gemmtune.dispatch import eager
from gemmtune.dispatch.table import TABLE, DispatchTable, dispatch_key

PKG = Path(__file__).resolve().parents[1] / "src" / "gemmtune"
EXTERN = ("extern",)


# -- no private reach-ins ---------------------------------------------------------------------

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (`from . import x` -> the package)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _dispatch_aliases(module: str, path: Path, tree: ast.AST) -> dict[str, str]:
    """Local name -> the dispatch module (or a dispatch module's object) it is bound to by an import."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gemmtune.dispatch") and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(module, path, node)
            for a in node.names:
                target = f"{mod}.{a.name}"
                if target.startswith("gemmtune.dispatch") or mod.startswith("gemmtune.dispatch"):
                    aliases[a.asname or a.name] = target
    return aliases


def private_reach_ins(source: str, module: str, path: Path) -> list[str]:
    """`X._name` where X is bound to another dispatch module or its object, and `from m import _name`."""
    tree = ast.parse(source)
    aliases = {k: v for k, v in _dispatch_aliases(module, path, tree).items() if v != module}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.ImportFrom) and _resolve(module, path, node).startswith("gemmtune.dispatch"):
            found += [f"{module}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_reaches_into_dispatch_privates():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        found += private_reach_ins(path.read_text(), _module_name(path), path)
    assert found == []


@pytest.mark.parametrize("source", [
    "from . import eager as api\nx = api._RECORDER\n",
    "from .table import TABLE\nTABLE._clear_hooks.append(f)\n",
    "from .eager import _key\n",
    "import gemmtune.dispatch.eager as e\ne._LOCK\n",
])
def test_the_scan_finds_a_reach_in(source):
    path = PKG / "dispatch" / "patching.py"
    assert len(private_reach_ins(source, "gemmtune.dispatch.patching", path)) == 1


def test_the_scan_allows_public_names_and_own_privates():
    path = PKG / "dispatch" / "patching.py"
    source = "from . import eager as api\nfrom .table import TABLE\napi.mm\nTABLE.recorder\n_x = 1\n_x.y\n"
    assert private_reach_ins(source, "gemmtune.dispatch.patching", path) == []


@pytest.mark.parametrize("path", sorted((PKG / "dispatch").glob("*.py")), ids=lambda p: p.name)
def test_dispatch_modules_under_400_lines_and_functions_under_50(path):
    text = path.read_text()
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 >= 50]
    assert (len(text.splitlines()) < 400, long) == (True, [])


# -- the table's behaviour ----------------------------------------------------------------------

def _key() -> tuple:
    return dispatch_key("mm", (torch.ones(2, 3), torch.ones(3, 4)), 1.0, 1.0, None, None)


def test_clear_hooks_run_on_clear_after_the_runners_are_gone():
    table = DispatchTable()
    seen = []
    table.on_clear(lambda: seen.append(table.stats()["entries"]))
    table.put("mm", torch.mm, _key())
    table.clear()
    table.clear()
    assert seen == [0, 0]
    assert table.runner("mm", _key()) is None


def test_counters_count_and_reset_on_clear():
    table = DispatchTable()
    for _ in range(3):
        next(table.hits)
    table.count_miss()
    table.count_tune()
    assert {k: table.stats()[k] for k in ("hits", "misses", "tunes")} == {"hits": 3, "misses": 1, "tunes": 1}
    counter = table.hits
    table.clear()
    assert {k: table.stats()[k] for k in ("hits", "misses", "tunes")} == {"hits": 0, "misses": 0, "tunes": 0}
    next(table.hits)
    assert table.hits is counter and table.stats()["hits"] == 1  # the warm path's bound counter still counts


def test_recording_sets_the_runners_aside_and_tells_the_hooks():
    table = DispatchTable()
    told = []
    table.on_recording(told.append)
    table.put("mm", torch.mm, _key())
    a, b = torch.ones(2, 3), torch.ones(3, 4)
    with table.recording() as seen:
        assert table.recorder is seen and table.runner("mm", _key()) is None
        assert table.dispatched("mm", _key()) is None
        table.record(_key(), "mm", (a, b), 1.0, 1.0, None, None)
        rec = table.record(_key(), "mm", (a, b), 1.0, 1.0, None, None)
        with pytest.raises(RuntimeError, match="nested"):
            with table.recording():
                pass
    assert told == [True, False]
    assert table.recorder is None and table.runner("mm", _key()) is torch.mm
    assert list(seen) == [_key()] and rec.calls == 2 and rec.describe() == "mm(2x3, 3x4)"
    with pytest.raises(RuntimeError, match="outside a recording"):
        table.record(_key(), "mm", (a, b), 1.0, 1.0, None, None)


def test_replace_runner_switches_only_the_entries_of_the_old_runner():
    table = DispatchTable()
    other = dispatch_key("mm", (torch.ones(5, 3), torch.ones(3, 4)), 1.0, 1.0, None, None)
    table.put("mm", torch.mm, _key())
    table.put("mm", torch.matmul, other)
    assert table.replace_runner("mm", torch.mm, torch.bmm) == [_key()]
    assert table.runner("mm", _key()) is torch.bmm and table.runner("mm", other) is torch.matmul
    assert table.replace_runner("mm", torch.bmm, torch.mm, keys=[other]) == []


def test_the_lock_is_held_by_a_change():
    table = DispatchTable()
    done = threading.Event()
    with table.lock:
        worker = threading.Thread(target=lambda: (table.put("mm", torch.mm, _key()), done.set()))
        worker.start()
        assert not done.wait(0.2)  # put waits for the lock
        assert table.runner("mm", _key()) is None
    worker.join(10)
    assert done.is_set() and table.runner("mm", _key()) is torch.mm


# -- the process's table behind the public API --------------------------------------------------

@pytest.mark.usefixtures("memory_store")
def test_public_api_reads_and_clears_the_process_table():
    a, b = torch.randn(4, 3), torch.randn(3, 2)
    gemmtune.mm(a, b, backends=EXTERN)
    gemmtune.mm(a, b, backends=EXTERN)
    stats = gemmtune.dispatch_stats()
    assert (stats["hits"], stats["misses"], stats["tunes"], stats["entries"]) == (1, 1, 1, 1)
    canon = eager.canonical_key("mm", (a, b), 1.0, 1.0, EXTERN, None)
    assert TABLE.runner("mm", canon) is torch.mm and TABLE.selection(canon).winner.name == "aten_mm"
    gemmtune.clear_dispatch_cache()
    assert TABLE.runner("mm", canon) is None and TABLE.selection(canon) is None
    assert gemmtune.dispatch_stats()["hits"] == 0


@pytest.mark.usefixtures("memory_store")
def test_clear_reaches_the_patched_layers_through_their_hook():
    """A patched layer keeps its own fast path for a decided shape; clearing the table (its on_clear
    hook) forgets it, so the next call of the layer reaches gemmtune and tunes again."""
    layer = gemmtune.patch(torch.nn.Linear(6, 4), backends=EXTERN)
    x = torch.randn(3, 6)
    with torch.no_grad():
        layer(x)
        layer(x)
        assert gemmtune.dispatch_stats()["tunes"] == 1
        gemmtune.clear_dispatch_cache()
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert gemmtune.dispatch_stats()["tunes"] == 1
    gemmtune.unpatch(layer)
