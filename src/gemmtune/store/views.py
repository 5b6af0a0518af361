"""What every store offers on top of `problems`, `load` and `save`: the `gemmtune cache` views.

`show`, `export` and `import_` are written once here for the SQLite store (`store.sqlite`) and the
Redis store (`store.redis`): both keep the same rows, so an export of one imports into the other.
"""

from __future__ import annotations

import json
from typing import Any

from .keys import Row, Stored, canon, env_key
from .marker import EXPORT_FORMAT


class StoreViews:
    """The `gemmtune cache show/export/import` views of a store.

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> s = Store(":memory:")
        >>> pick = Row("aten_mm", None, "{}", "{}", 1.0, "ok")
        >>> _ = s.save("env", {"device": "cpu"}, "p", "mm(8x4, 4x2)", [pick], pick, replace_pick=False)
        >>> Store(":memory:").import_(s.export()), [p["problem"] for p in s.show("mm(8")]
        (1, ['p'])
    """

    def problems(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def load(self, env: str, problem: str) -> Stored:
        raise NotImplementedError

    def save(self, env: str, info: dict[str, Any], problem: str, describe: str, rows: list[Row],
             pick: Row, replace_pick: bool | Row, provisional: str | None = None) -> Row:
        raise NotImplementedError

    def show(self, needle: str) -> list[dict[str, Any]]:
        """The picks whose problem or description contains `needle`, each with its timings."""
        out = []
        for p in self.problems():
            if needle in p["problem"] or needle in (p["describe"] or ""):
                rows = self.load(p["env"], p["problem"]).rows
                p["choices"] = [dict(template=r.template, src_hash=r.src_hash, config=json.loads(r.config),
                                     runtime_params=json.loads(r.runtime), ms=r.ms, status=r.status)
                                for r in sorted(rows, key=lambda r: (r.ms is None, r.ms or 0))]
                out.append(p)
        return out

    def export(self) -> dict[str, Any]:
        """Every pick and timing as JSON-ready data (loads back with `import_` or as a lookup table).
        Each entry carries the signature it was stored with ("sig"), where it has one."""
        entries = []
        for p in self.problems():
            stored = self.load(p["env"], p["problem"])
            pick = stored.pick
            if pick is None:  # listed problems have a pick; a concurrent clear may remove it
                continue
            sigs = stored.sigs or {}
            entries.append({
                "problem": p["problem"], "describe": p["describe"], "env": p["env_info"],
                "pick": _signed({"template": pick.template, "src_hash": pick.src_hash, "config": json.loads(pick.config),
                                 "runtime_params": json.loads(pick.runtime), "ms": pick.ms, "strategy": pick.stage},
                                sigs.get("pick")),
                "timings": [_signed({"template": r.template, "src_hash": r.src_hash, "config": json.loads(r.config),
                                     "runtime_params": json.loads(r.runtime), "ms": r.ms, "status": r.status,
                                     "stage": r.stage}, sigs.get(r.choice_key)) for r in stored.rows],
            })
        return {"format": EXPORT_FORMAT, "entries": entries}

    def import_(self, data: dict[str, Any], source: str = "import") -> int:
        """Store every entry of an `export`, checked completely (the file's form, then each entry
        through the store's schema, `store.entry`) before anything is written.

        Importing is an act of trust by the one who runs it: with a key, the store signs what it
        imports under that key (the file's own signatures are not needed, and not kept)."""
        from .schema import check_export

        check_export(data, source, need_env=True)
        staged = [_staged(e, f"{source}: entry {i} ({e['problem']})") for i, e in enumerate(data["entries"])]
        for e, rows, pick in staged:
            info = e["env"]
            self.save(env_key(info), info, e["problem"], e.get("describe", ""), rows, pick, replace_pick=True)
        return len(staged)


def _signed(obj: dict[str, Any], sig: str | None) -> dict[str, Any]:
    if sig is not None:
        obj["sig"] = sig
    return obj


def _staged(e: dict[str, Any], where: str) -> tuple[dict[str, Any], list[Row], Row]:
    """An export entry's rows and pick, each through the store's schema (a LookupTableError naming the
    file, the entry and the fault otherwise)."""
    from ..core.errors import LookupTableError
    from . import entry

    try:
        entry.name(e["problem"], "problem key", entry.MAX_KEY_CHARS)
        entry.describe(e.get("describe"))
        entry.info(canon(e["env"]))
        rows = [entry.row(t["template"], t["src_hash"], canon(t["config"]), canon(t["runtime_params"]), t.get("ms"),
                          t["status"], t.get("stage")) for t in e["timings"]]
        p = e["pick"]
        pick = entry.pick(p["template"], p.get("src_hash"), canon(p.get("config", {})), canon(p.get("runtime_params", {})),
                          p.get("ms"), p.get("strategy"))
    except (entry.BadEntry, KeyError, TypeError, ValueError) as exc:
        raise LookupTableError(f"{where}: {exc}") from None
    return e, rows, pick
