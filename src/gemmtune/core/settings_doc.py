"""docs/SETTINGS.md's table, generated from the settings' specs (`core.settings`), so the two cannot drift."""

from __future__ import annotations

from dataclasses import fields

from .settings import EFFORTS, Settings, _assignments, _default_text, env_var
from .spec import Spec

__all__ = ["settings_table"]


def settings_table() -> str:
    """The Markdown table of every setting in docs/SETTINGS.md, generated from the specs.

    Example:
        >>> settings_table().splitlines()[0]
        '| field | environment variable | type | valid values | default | meaning |'
    """
    rows = ["| field | environment variable | type | valid values | default | meaning |",
            "|---|---|---|---|---|---|"]
    for f in fields(Settings):
        spec: Spec = f.metadata["spec"]
        valid = spec.range_text() + (", finite" if spec.kind == "float" else "")
        cells = [f"`{f.name}`", f"`{env_var(f.name)}`", spec.describe_type(), valid,
                 _default_text(f.default), spec.doc]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    rows += ["", "| effort | sets | in short |", "|---|---|---|"]
    rows += [f"| `{e.name}` | {_assignments(e.changes()) or '(nothing)'} | {e.summary} |" for e in EFFORTS.values()]
    return "\n".join(rows) + "\n"
