"""Settings is read in one module per concern: a read of a Settings field anywhere else fails here.

A read is an attribute access `<x>.<field>` (or `getattr(<x>, "<field>")`) where `<field>` is a
Settings field and `<x>` names a settings object (a name or attribute containing "settings").  A
tune's reads live in `pipeline/plan.py` (`plan_for`); the measuring layer reads its timer and worker
fields; the dispatch layer and the CLI read theirs.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from gemmtune.core.settings import Settings

PKG = Path(__file__).resolve().parents[1] / "src" / "gemmtune"
FIELDS = frozenset(f.name for f in dataclasses.fields(Settings))
ALLOWED = {
    "core/settings.py": "the Settings object itself (validation, presets)",
    "pipeline/plan.py": "a tune's plan: strategy, final, budget, runner, store key",
    "measure/timers.py": "the timer's own fields (rep_ms, reps, L2 flush, host overhead)",
    "measure/isolation.py": "the worker process (run timeout)",
    "measure/factory.py": "the runner: an explicit isolation never falls back",
    "measure/jobs.py": "the worker's compile timeout",
    "templates/registry.py": "the template pool (hopper, config space, preview)",
    "inductor/tuning.py": "the template pool Inductor's handler offers",
    "offline/sweep.py": "a sweep records the timer's settings with its dataset",
    "cli/__init__.py": "the CLI's report rows and store location",
    "store/trust.py": "the store's trust policy: its key, what counts as shared, the lock timeout",
    "store/locations.py": "the store a Settings names, under its trust policy",
}
ALLOWED_PACKAGES = ("dispatch/",)  # the eager dispatch reads its own switches (distributed, isolation, timeouts)


def _holder(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def reads(source: str) -> list[tuple[int, str]]:
    """(line, field) of every Settings field read in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in FIELDS:
            holder = _holder(node.value)
            if holder and "settings" in holder.lower():
                found.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in FIELDS):
            holder = _holder(node.args[0])
            if holder and "settings" in holder.lower():
                found.append((node.lineno, node.args[1].value))
    return found


def _modules() -> dict[str, list[tuple[int, str]]]:
    return {str(p.relative_to(PKG)): reads(p.read_text()) for p in sorted(PKG.rglob("*.py"))}


def test_the_scan_sees_reads_of_every_form():
    src = "def f(settings, ctx):\n    a = settings.top_x\n    b = ctx.settings.budget_s\n    c = getattr(settings, 'store')\n" \
          "    d = plan.top_x\n    e = settings.with_(top_x=1)\n"
    assert reads(src) == [(2, "top_x"), (3, "budget_s"), (4, "store")]


def test_settings_are_read_only_where_allowed():
    wrong = [f"{mod}:{line} reads .{name}" for mod, found in _modules().items()
             if mod not in ALLOWED and not mod.startswith(ALLOWED_PACKAGES) for line, name in found]
    assert wrong == [], "Settings read outside its modules (add the concern to the plan): " + "; ".join(wrong)


def test_the_engine_reads_no_settings_and_the_plan_reads_them():
    found = _modules()
    assert found["engine.py"] == [] and "engine.py" not in ALLOWED
    assert len(found["pipeline/plan.py"]) >= 20  # the plan is where a tune's settings are read
    assert all(found[m] for m in ALLOWED if m != "core/settings.py"), "an allowed module that reads nothing"
