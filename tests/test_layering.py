"""The package's shape: sub-packages import downwards only, no import cycles (imports inside
functions count), modules under 400 lines and functions under 50, engine.py under 250.

The layers, bottom to top (docs/ARCHITECTURE.md draws them):

    core -> templates -> search, measure -> store -> pipeline -> engine, report -> dispatch, offline, inductor -> cli

A module may import from its own sub-package and from any lower layer; never from a layer above
or beside it.  `gemmtune/__init__.py` and `__main__.py` sit on top and only re-export or start.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "gemmtune"
LAYERS = {
    "core": 0, "templates": 1, "search": 2, "measure": 2, "store": 3, "pipeline": 4, "engine": 5, "report": 5,
    "dispatch": 6, "offline": 6, "inductor": 6, "cli": 7, "": 8, "__main__": 8,
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50


def _modules() -> dict[str, Path]:
    """Dotted name (relative to gemmtune; "" for the package itself) -> file."""
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _targets(name: str, path: Path, node: ast.AST) -> list[str]:
    """The gemmtune modules an import statement reaches (every import, at any depth)."""
    if isinstance(node, ast.Import):
        names = [a.name[len("gemmtune."):] for a in node.names if a.name.startswith("gemmtune.")]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".") if name else []
            if path.name != "__init__.py":
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
        elif (node.module or "").split(".")[0] == "gemmtune":
            mod = node.module[len("gemmtune"):].lstrip(".")
        else:
            return []
        children = [f"{mod}.{a.name}".lstrip(".") for a in node.names]
        # `from . import x` names the module x; `from .m import f` names m
        names = [c for c in children if c in MODULES] or [mod]
    else:
        return []
    return [n for n in names if n in MODULES]


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            found.update(_targets(name, path, node))
        # a package re-exporting its own children is not a dependency on them
        edges[name] = {t for t in found if t != name and not (t.startswith(name + ".") or name == "")}
    return edges


EDGES = _edges()


def _layer(module: str) -> tuple[str, int]:
    top = module.split(".")[0]
    return top, LAYERS[top]


def test_every_top_level_module_has_a_layer():
    assert sorted({m.split(".")[0] for m in MODULES} - set(LAYERS)) == []


def test_imports_point_down_the_layers():
    wrong = []
    for src, targets in EDGES.items():
        top, rank = _layer(src)
        for t in targets:
            t_top, t_rank = _layer(t)
            if t_top != top and t_rank >= rank:
                wrong.append(f"{src} -> {t}")
    assert wrong == [], "imports that go up or sideways: " + ", ".join(sorted(wrong))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles():
    assert _cycles(EDGES) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_function_imports_count_as_edges():
    tree = ast.parse("def f():\n    from .core import settings\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert _targets("engine", PKG / "engine.py", node) == ["core.settings"]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_and_function_sizes(name):
    path = MODULES[name]
    text = path.read_text()
    assert len(text.splitlines()) < MAX_MODULE_LINES, f"{path.name}: {len(text.splitlines())} lines"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 >= MAX_FUNCTION_LINES]
    assert long == []


def test_the_engine_reads_as_its_pipeline():
    """engine.py holds the pipeline's steps only (plan, recall, search, remember): under 250 lines."""
    assert len((PKG / "engine.py").read_text().splitlines()) <= 250


def _class_names(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Class name -> the modules that define a class of that name (at any depth)."""
    where: dict[str, list[str]] = {}
    for name, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(name or "gemmtune")
    return where


def test_every_class_name_is_used_once():
    """One name per concept: two classes of one name in the package are two concepts sharing a name
    (a timing is `gemmtune.Timing` everywhere, from the runner to the store and the report)."""
    twice = {n: ms for n, ms in _class_names(MODULES).items() if len(ms) > 1}
    assert twice == {}


def test_the_class_name_check_finds_a_duplicate(tmp_path):
    for mod in ("a", "b"):
        (tmp_path / f"{mod}.py").write_text("class Measured:\n    pass\n")
    found = _class_names({"a": tmp_path / "a.py", "b": tmp_path / "b.py"})
    assert found == {"Measured": ["a", "b"]}


# -- bench/: the scripts a user or maintainer runs ------------------------------------------------

BENCH = PKG.parents[1] / "bench"
BENCH_MAX_SCRIPTS, BENCH_MAX_LINES = 12, 2815  # 2,500 until serving.py joined; 2,760 until compare.py timed padded
# views; 2,770 until model_runs.py ran GPT-2 with its padded head; 2,780 until compare.py held B as a frozen weight;
# 2,795 until results.py rendered a whole model's eager variants and the static per-M compiles
# the bench modules a bench module may import (the others run scripts as processes, if at all)
BENCH_IMPORTS = {"models": {"model_runs"}, "serving": {"model_runs", "models"}, "profiling": {"model_runs"}}
# modules of tests/ a bench script may import: the redis-server starter the store's tests use
BENCH_FROM_TESTS = {"redis_server"}


def _bench_imports(path: Path) -> set[str]:
    """The top-level names of every absolute import in `path` (at any depth)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def _bench_edges(folder: Path) -> dict[str, set[str]]:
    scripts = {p.stem: p for p in folder.glob("*.py")}
    return {name: _bench_imports(path) & set(scripts) - {name} for name, path in scripts.items()}


def _against_the_direction(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets if b not in BENCH_IMPORTS.get(a, ()))


def test_bench_holds_at_most_12_scripts_of_at_most_2815_lines_in_all():
    scripts = sorted(BENCH.glob("*.py"))
    lines = {p.name: len(p.read_text().splitlines()) for p in scripts}
    assert len(scripts) <= BENCH_MAX_SCRIPTS, sorted(lines)
    assert sum(lines.values()) <= BENCH_MAX_LINES, lines


def test_bench_modules_import_in_one_direction_without_cycles():
    edges = _bench_edges(BENCH)
    assert _cycles(edges) == []
    assert _against_the_direction(edges) == []


def test_bench_imports_no_test_module_but_the_redis_server_starter():
    tests = {p.stem for p in (PKG.parents[1] / "tests").glob("*.py")} - BENCH_FROM_TESTS
    wrong = {p.name: sorted(_bench_imports(p) & tests) for p in BENCH.glob("*.py") if _bench_imports(p) & tests}
    assert wrong == {}


def test_no_bench_script_shadows_a_standard_module():
    """A script's folder comes first on its path: a bench script named profile.py would be the `profile`
    module of every bench script (cProfile imports it, and torch imports cProfile)."""
    import sys

    assert sorted({p.stem for p in BENCH.glob("*.py")} & sys.stdlib_module_names) == []


def test_every_bench_script_has_a_help_and_a_line_in_the_bench_readme():
    readme = (BENCH / "README.md").read_text()
    for path in BENCH.glob("*.py"):
        text = path.read_text()
        assert "argparse.ArgumentParser(" in text and 'if __name__ == "__main__":' in text, path.name
        assert f"bench/{path.name}" in readme, f"bench/README.md has no line for {path.name}"


def test_the_bench_checks_find_a_cycle_and_an_import_against_the_direction(tmp_path):
    (tmp_path / "models.py").write_text("import model_runs\n")
    (tmp_path / "model_runs.py").write_text("def f():\n    from models import build\n")
    (tmp_path / "gpu_run.py").write_text("import json\n")
    edges = _bench_edges(tmp_path)
    assert edges == {"models": {"model_runs"}, "model_runs": {"models"}, "gpu_run": set()}
    assert _cycles(edges) == [["model_runs", "models"]]
    assert _against_the_direction(edges) == ["model_runs -> models"]
