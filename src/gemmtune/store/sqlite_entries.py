"""The SQLite store's entries: read through the schema (`store.entry`), bounded in the query, and
written signed (with a key).

Every text column is read as `_text(col)`: SQLite measures the value first (`length`, or
`octet_length` where SQLite has it) and returns 1 instead of a value over `MAX_ENTRY_BYTES`, 0 for a
value that is not text, else its bytes (decoded here: invalid UTF-8 is a bad entry, not an error of
the connection).  A problem's rows are read until `MAX_PROBLEM_ROWS` or `MAX_PROBLEM_BYTES`; past
either, the problem's rows are refused as a whole.  A bad entry is skipped (`entry.Entries.skip`) and
replaced when its problem is written again; a good one is never overwritten by a bad reading.

Example:
    >>> from gemmtune.store.sqlite import Store
    >>> s = Store(":memory:")
    >>> pick = Row("aten_mm", None, "{}", "{}", 1.0, "ok")
    >>> _ = s.save("env", {}, "p", "d", [pick], pick, replace_pick=False)
    >>> _ = s._db.execute("UPDATE timings SET ms='fast'")
    >>> s.entries.quiet = True
    >>> s.load("env", "p").rows, s.bad_entries[0][1]
    ((), "ms is 'fast', not a number")
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from . import entry
from .catalog import catalog_fault
from .entry import MAX_ENTRY_BYTES, MAX_KEY_CHARS, MAX_MARK_CHARS, BadEntry, Entries, shown
from .keys import Row, Stored, canon

__all__ = ["load", "save", "problems", "read_pick"]

_LEN = "octet_length" if sqlite3.sqlite_version_info >= (3, 43) else "length"


def _text(col: str, limit: int = MAX_ENTRY_BYTES) -> str:
    return (f"CASE WHEN {col} IS NULL THEN NULL WHEN typeof({col}) != 'text' THEN 0 "
            f"WHEN {_LEN}({col}) > {limit} THEN 1 ELSE CAST({col} AS BLOB) END")


def _number(col: str) -> str:
    return (f"CASE WHEN typeof({col}) IN ('integer', 'real', 'null') THEN {col} "
            f"ELSE CAST(substr({col}, 1, 40) AS BLOB) END")


def _dec(value: Any, what: str) -> Any:
    """A `_text` column's value: None, or the text (else BadEntry)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise BadEntry(f"{what} is not UTF-8 text") from None
    if value == 1:
        raise BadEntry(f"{what} is over the size bound ({MAX_ENTRY_BYTES})")
    raise BadEntry(f"{what} is not text")


def _num(value: Any) -> Any:
    """A `_number` column's value (text shown as text, so the schema names it)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _sig(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else "?"


def _choice(t: str = "") -> str:
    """The columns of a row's choice and time, bounded (`t`: a table alias and a dot)."""
    return f"{_text(t + 'template')}, {_text(t + 'src_hash')}, {_text(t + 'config')}, {_text(t + 'runtime')}, " \
           f"{_number(t + 'ms')}"


_CHOICE = _choice()
_SIZE = " + ".join(f"ifnull({_LEN}({c}), 0)" for c in ("template", "src_hash", "config", "runtime", "status", "stage",
                                                         "sig"))
_ROWS = (f"SELECT rowid, {_CHOICE}, {_text('status')}, {_text('stage')}, {_text('sig')}, {_SIZE} FROM timings "
         f"WHERE env=? AND problem=? LIMIT {entry.MAX_PROBLEM_ROWS + 1}")
_PICK = (f"SELECT {_text('describe', MAX_KEY_CHARS)}, {_CHOICE}, {_text('strategy')}, {_text('sig')} FROM picks "
         "WHERE env=? AND problem=?")
_MARK = f"SELECT {_text('run', MAX_MARK_CHARS)}, {_text('sig')} FROM provisional_picks WHERE env=? AND problem=?"
_ENV = f"SELECT {_text('info')}, {_text('sig')} FROM envs WHERE env=?"


def _where(table: str, env: str, problem: str, extra: str = "") -> str:
    return f"{table}[{shown(env, 40)}, {shown(problem)}{extra}]"


def _parse_row(rec: tuple) -> Row:
    _, t, h, c, r, m, s, st = rec[:8]
    return entry.row(_dec(t, "template"), _dec(h, "src_hash"), _dec(c, "config"), _dec(r, "runtime"), _num(m),
                     _dec(s, "status"), _dec(st, "stage"))


def read_rows(db: sqlite3.Connection, entries: Entries, env: str, problem: str
              ) -> tuple[dict[Any, Row], dict[Any, str], bool]:
    """(good rows by choice key, their signatures, whether the problem's rows are refused as a whole)."""
    rows: dict[Any, Row] = {}
    sigs: dict[Any, str] = {}
    size, check = 0, entries.row_check(env, problem, entry.MAX_PROBLEM_ROWS)
    for i, rec in enumerate(db.execute(_ROWS, (env, problem))):
        size += rec[9]
        if i >= entry.MAX_PROBLEM_ROWS or size > entry.MAX_PROBLEM_BYTES:
            entries.skip(_where("timings", env, problem), f"the problem has more than {entry.MAX_PROBLEM_ROWS} rows "
                         f"or {entry.MAX_PROBLEM_BYTES} bytes of them")
            return {}, {}, True
        sig = _sig(rec[8])
        try:  # (`Entries.read`, inlined: a problem may have thousands of rows)
            r = _parse_row(rec)
        except BadEntry as exc:
            entries.skip(_where("timings", env, problem, f", row {rec[0]}"), str(exc))
            continue
        if check is not None and not check(r, sig):
            entries.unverified(_where("timings", env, problem, f", row {rec[0]}"), sig)
            continue
        rows[r.choice_key] = r
        if sig is not None:
            sigs[r.choice_key] = sig
    return rows, sigs, False


def read_pick(db: sqlite3.Connection, entries: Entries, env: str, problem: str) -> tuple[Row | None, str | None, bool]:
    """(the pick when good, its signature, whether a pick is stored at all: good or bad)."""
    rec = db.execute(_PICK, (env, problem)).fetchone()
    if rec is None:
        return None, None, False
    describe: list[str | None] = [None]

    def parse() -> tuple[Row, str | None]:
        describe[0] = entry.describe(_dec(rec[0], "describe"))
        return entry.pick(_dec(rec[1], "template"), _dec(rec[2], "src_hash"), _dec(rec[3], "config"),
                          _dec(rec[4], "runtime"), _num(rec[5]), _dec(rec[6], "strategy")), sig

    sig = _sig(rec[7])
    got = entries.read(lambda: _where("picks", env, problem), parse,
                       lambda r: entry.pick_parts(env, problem, describe[0], r))
    return got, sig, True


def read_mark(db: sqlite3.Connection, entries: Entries, env: str, problem: str) -> str | None:
    rec = db.execute(_MARK, (env, problem)).fetchone()
    if rec is None:
        return None
    return entries.read(lambda: _where("provisional_picks", env, problem),
                        lambda: (entry.mark(_dec(rec[0], "provisional mark")), _sig(rec[1])),
                        lambda m: entry.mark_parts(env, problem, m))


def load(db: sqlite3.Connection, entries: Entries, env: str, problem: str) -> Stored:
    """The good rows, pick and provisional mark of one problem (bad ones skipped)."""
    rows, sigs, _ = read_rows(db, entries, env, problem)
    pick, sig, _ = read_pick(db, entries, env, problem)
    if sig is not None:
        sigs["pick"] = sig
    mark = read_mark(db, entries, env, problem) if pick is not None else None
    return Stored(tuple(rows.values()), pick, mark, sigs or None)


def _env_good(db: sqlite3.Connection, entries: Entries, env: str) -> bool | None:
    """Whether the stored env info is good (None: there is none)."""
    rec = db.execute(_ENV, (env,)).fetchone()
    if rec is None:
        return None
    return entries.read(lambda: f"envs[{shown(env, 40)}]", lambda: (entry.info(_dec(rec[0], "env info")), _sig(rec[1])),
                        lambda obj: entry.info_parts(env, obj)) is not None


def save(db: sqlite3.Connection, entries: Entries, env: str, info: dict[str, Any], problem: str, describe: str,
         rows: list[Row], pick: Row, replace_pick: bool | Row, provisional: str | None, now: float) -> bool:
    """Write rows and the pick in the caller's transaction (see `Store.save`); returns whether the pick
    was written.  A stored row gives way as `entry.replaces` says; a bad row, pick or env info is
    replaced as if it were absent."""
    if _env_good(db, entries, env) is not True:
        text = canon(info)
        db.execute("INSERT OR REPLACE INTO envs(env, info, sig) VALUES (?, ?, ?)",
                   (env, text, entries.sign(entry.info_parts(env, dict(info)))))
    current, _, refused = read_rows(db, entries, env, problem)
    if refused:
        db.execute("DELETE FROM timings WHERE env=? AND problem=?", (env, problem))
    new = [r for r in map(entry.storable, rows) if entry.replaces(current.get(r.choice_key), r)]
    db.executemany(
        "INSERT OR REPLACE INTO timings(env, problem, template, src_hash, config, runtime, ms, status, stage, "
        "recorded, sig) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        [(env, problem, r.template, r.src_hash, r.config, r.runtime, r.ms, r.status, r.stage, now,
          entries.sign(entry.row_parts(env, problem, r))) for r in new])
    if not _replaces(db, entries, env, problem, replace_pick):
        return False
    pick = entry.storable(pick)
    db.execute("INSERT OR REPLACE INTO picks(env, problem, describe, template, src_hash, config, runtime, ms, "
               "strategy, recorded, sig) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
               (env, problem, describe, pick.template, pick.src_hash, pick.config, pick.runtime, pick.ms,
                pick.stage, now, entries.sign(entry.pick_parts(env, problem, describe, pick))))
    db.execute("DELETE FROM provisional_picks WHERE env=? AND problem=?", (env, problem))
    if provisional is not None:
        db.execute("INSERT INTO provisional_picks(env, problem, run, sig) VALUES (?, ?, ?, ?)",
                   (env, problem, provisional, entries.sign(entry.mark_parts(env, problem, provisional))))
    return True


def _replaces(db: sqlite3.Connection, entries: Entries, env: str, problem: str, replace_pick: bool | Row) -> bool:
    """Whether a save writes its pick: `True` always; else when no pick is stored or the stored one is
    bad; a Row also while the stored pick is still that one (a compare-and-set: of two processes
    replacing one pick, the first wins)."""
    if replace_pick is True:
        return True
    cur, _, present = read_pick(db, entries, env, problem)
    if not present or cur is None:
        return True
    r = replace_pick
    return isinstance(r, Row) and (cur.template, cur.src_hash, cur.config, cur.runtime) == (
        r.template, r.src_hash, r.config, r.runtime)


_LISTING = (f"SELECT {_text('p.env', MAX_KEY_CHARS)}, {_text('p.problem', MAX_KEY_CHARS)}, "
            f"{_text('p.describe', MAX_KEY_CHARS)}, {_choice('p.')}, "
            f"{_text('p.strategy')}, {_text('p.sig')}, {_text('e.info')}, {_text('e.sig')}, e.env IS NOT NULL, "
            "(SELECT count(*) FROM timings t WHERE t.env=p.env AND t.problem=p.problem) "
            "FROM picks p LEFT JOIN envs e ON e.env=p.env ORDER BY p.recorded")


def problems(db: sqlite3.Connection, entries: Entries) -> list[dict[str, Any]]:
    """Every stored pick whose entries are good (`gemmtune cache ls`), oldest first."""
    out = []
    for rec in db.execute(_LISTING):
        got = _listed(entries, rec)
        if got is not None:
            out.append(got)
    return out


def _listed(entries: Entries, rec: tuple) -> dict[str, Any] | None:
    names = entries.read(lambda: f"picks[{shown(rec[0], 40)}, {shown(rec[1])}]",
                         lambda: ((entry.name(_dec(rec[0], "env key"), "env key", MAX_KEY_CHARS),
                                   entry.name(_dec(rec[1], "problem key"), "problem key", MAX_KEY_CHARS),
                                   entry.describe(_dec(rec[2], "describe"))), None))
    if names is None:
        return None
    env, problem, describe = names
    pick = entries.read(lambda: _where("picks", env, problem),
                        lambda: (entry.pick(_dec(rec[3], "template"), _dec(rec[4], "src_hash"), _dec(rec[5], "config"),
                                            _dec(rec[6], "runtime"), _num(rec[7]), _dec(rec[8], "strategy")), _sig(rec[9])),
                        lambda r: entry.pick_parts(env, problem, describe, r))
    info: Any = {}
    if rec[12]:
        info = entries.read(lambda: f"envs[{shown(env, 40)}]",
                            lambda: (entry.info(_dec(rec[10], "env info")), _sig(rec[11])),
                            lambda obj: entry.info_parts(env, obj))
    if pick is None or info is None:
        return None
    return dict(problem=problem, describe=describe, template=pick.template, config=json.loads(pick.config),
                runtime_params=json.loads(pick.runtime), ms=pick.ms, env=env, env_info=info, timings=rec[13])


def check(db: sqlite3.Connection, entries: Entries) -> int:
    """Read every entry of the store through the schema, signatures (with a key) and gemmtune's shipped
    templates (`store.catalog`); the bad ones go to `entries`.  Returns how many were read."""
    keys = f"{_text('env', MAX_KEY_CHARS)}, {_text('problem', MAX_KEY_CHARS)}"
    big = (f"SELECT substr(env, 1, 80), substr(problem, 1, 200), count(*) FROM timings GROUP BY env, problem "
           f"HAVING count(*) > {entry.MAX_PROBLEM_ROWS} OR total({_LEN}(template) + {_LEN}(config) + {_LEN}(runtime) "
           f"+ ifnull({_LEN}(src_hash), 0) + {_LEN}(status) + ifnull({_LEN}(stage), 0)) > {entry.MAX_PROBLEM_BYTES}")
    for env, problem, count in db.execute(big):
        entries.skip(_where("timings", str(env), str(problem)), f"the problem has {count} rows, or more than "
                     f"{entry.MAX_PROBLEM_BYTES} bytes of them (at most {entry.MAX_PROBLEM_ROWS} rows)")
    n = 0
    for rec in db.execute(f"SELECT rowid, {keys}, {_CHOICE}, {_text('status')}, {_text('stage')}, {_text('sig')} "
                          "FROM timings"):
        n += 1
        _check_one(entries, "timings", rec, lambda env, problem: (_parse_row(rec[:1] + rec[3:]), _sig(rec[10])),
                   lambda env, problem, r: entry.row_parts(env, problem, r))
    for rec in db.execute(f"SELECT rowid, {keys}, {_text('describe', MAX_KEY_CHARS)}, {_CHOICE}, {_text('strategy')}, "
                          f"{_text('sig')} FROM picks"):
        n += 1
        _check_one(entries, "picks", rec, lambda env, problem: (
            (entry.pick(_dec(rec[4], "template"), _dec(rec[5], "src_hash"), _dec(rec[6], "config"),
                        _dec(rec[7], "runtime"), _num(rec[8]), _dec(rec[9], "strategy")),
             entry.describe(_dec(rec[3], "describe"))), _sig(rec[10])),
            lambda env, problem, p: entry.pick_parts(env, problem, p[1], p[0]))
    for rec in db.execute(f"SELECT rowid, {keys}, {_text('run', MAX_MARK_CHARS)}, {_text('sig')} FROM provisional_picks"):
        n += 1
        _check_one(entries, "provisional_picks", rec,
                   lambda env, problem: (entry.mark(_dec(rec[3], "provisional mark")), _sig(rec[4])),
                   lambda env, problem, m: entry.mark_parts(env, problem, m))
    for rec in db.execute(f"SELECT rowid, {_text('env', MAX_KEY_CHARS)}, '-', {_text('info')}, {_text('sig')} FROM envs"):
        n += 1
        _check_one(entries, "envs", rec, lambda env, _: (entry.info(_dec(rec[3], "env info")), _sig(rec[4])),
                   lambda env, _, obj: entry.info_parts(env, obj))
    return n


def _check_one(entries: Entries, table: str, rec: tuple, parse: Any, parts: Any) -> None:
    """Check one record (rowid, env, problem, ...) of `table`; a row or pick also against the catalog."""
    try:
        env = entry.name(_dec(rec[1], "env key"), "env key", MAX_KEY_CHARS)
        problem = rec[2] if rec[2] == "-" else entry.name(_dec(rec[2], "problem key"), "problem key", MAX_KEY_CHARS)
    except BadEntry as exc:
        entries.skip(f"{table}[row {rec[0]}]", str(exc))
        return
    key = (lambda: _where(table, env, problem, f", row {rec[0]}")) if table != "envs" else (lambda: f"envs[{shown(env, 40)}]")
    got = entries.read(key, lambda: parse(env, problem), lambda e: parts(env, problem, e))
    r = got if isinstance(got, Row) else got[0] if isinstance(got, tuple) else None
    why = catalog_fault(r, problem) if r is not None else None
    if why is not None:
        entries.skip(key(), why)
