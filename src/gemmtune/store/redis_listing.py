"""The Redis store's listings: the index of picks (`gemmtune cache ls`) and every entry under the
prefix (`gemmtune cache check`), read through the schema a page at a time (`store.redis_codec`).

The index's members are read by `INDEX`, which sends a member over the bound as its size and first
80 bytes only.
"""

from __future__ import annotations

import json
from typing import Any

from . import entry
from .catalog import catalog_fault
from .entry import Entries, shown
from .redis_codec import BOUNDS, Lua, _READ, _info, _pick, _read_value, _refusal, _text

__all__ = ["INDEX", "check", "members", "problems"]

PAGE = 1000  # index members read per call

# KEYS: the index.  ARGV: the bound of a member, the first rank, how many.  {'type', T} for a key of
# another type; else per member {'value', M} or {'size', N, its first 80 bytes}.
INDEX = """
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then return {} end
if t ~= 'zset' then return {{'type', t}} end
local out, first = {}, tonumber(ARGV[2])
for i, m in ipairs(redis.call('ZRANGE', KEYS[1], first, first + tonumber(ARGV[3]) - 1)) do
  if #m > tonumber(ARGV[1]) then out[i] = {'size', #m, string.sub(m, 1, 80)} else out[i] = {'value', m} end
end
return out
"""

_INDEX = Lua(INDEX)


def members(store: Any, entries: Entries | None = None) -> list[tuple[str, str]]:
    """The index's good members (bad ones skipped), oldest first, read a page at a time."""
    key, first = f"{store.prefix}:index", 0
    out: list[tuple[str, str]] = []
    entries = entries if entries is not None else store.entries
    while True:
        page = _INDEX(store._client, [key], [str(2 * entry.MAX_KEY_CHARS + 16), str(first), str(PAGE)])
        for reply in page:
            if reply[0] == b"type":
                entries.skip(key, _refusal(reply) or "")
                return out
            if reply[0] == b"size":
                entries.skip(f"{key} member {shown(reply[2].decode(errors='replace'))}", _refusal(reply[:2]) or "")
                continue
            got = entries.read(lambda: f"{key} member {shown(reply[1].decode(errors='replace'))}",
                                     lambda: (entry.member(_text(reply[1], "index member")), None))
            if got is not None:
                out.append(got)
        if len(page) < PAGE:
            return out
        first += PAGE


def problems(store: Any) -> list[dict[str, Any]]:
    """Every stored pick whose entries are good (`gemmtune cache ls`), oldest first."""
    out = []
    listed = members(store)
    for start in range(0, len(listed), PAGE):
        chunk = listed[start:start + PAGE]
        keys = [k for env, problem in chunk for k in (store._key("pick", env, problem), store._key("rows", env, problem),
                                                       store._key("env", env))]
        replies = _READ(store._client, keys, [*BOUNDS, *["get", "len", "get"] * len(chunk)])
        for i, (env, problem) in enumerate(chunk):
            got = _listed(store.entries, keys[3 * i: 3 * i + 3], env, problem, replies[3 * i: 3 * i + 3])
            if got is not None:
                out.append(got)
    return out


def _listed(entries: Entries, keys: list[str], env: str, problem: str, replies: list) -> dict[str, Any] | None:
    pick_r, rows_r, env_r = replies
    got = _read_value(entries, keys[0], pick_r, _pick, lambda p: entry.pick_parts(env, problem, p[1], p[0]))
    if got is None:  # none (cleared or forgotten meanwhile), or bad
        return None
    info: Any = {}
    if env_r[0] != b"none":
        found = _read_value(entries, keys[2], env_r, _info, lambda obj: entry.info_parts(env, obj))
        if found is None:
            return None
        info = found[0]
    (pick, describe), _ = got
    return dict(problem=problem, describe=describe, template=pick.template, config=json.loads(pick.config),
                runtime_params=json.loads(pick.runtime), ms=pick.ms, env=env, env_info=info,
                timings=rows_r[1] if rows_r[0] == b"len" else 0)


def check(store: Any, entries: Entries, pattern: str) -> int:
    """Read every entry under the store's prefix through the schema, signatures (with a key) and
    gemmtune's shipped templates (`store.catalog`); the bad ones go to `entries`.  Compiled
    kernels (`PREFIX:kernel:…`) are checked where they are used (`store.kernel_entries`).  Returns how
    many entries were read.  `pattern`: SCAN's pattern of every key under the prefix (escaped)."""
    cursor, n = 0, 0
    while True:
        cursor, keys = store._client.execute_command("SCAN", cursor, "MATCH", pattern, "COUNT", 500, NEVER_DECODE=True)
        n += _check_keys(store, entries, keys)
        if int(cursor) == 0:
            return n


def _check_keys(store: Any, entries: Entries, raw_keys: list[bytes]) -> int:
    plan: list[tuple] = []
    n = 0
    for raw in raw_keys:
        key = raw.decode("utf-8", "backslashreplace")
        kind, _, rest = key[len(store.prefix) + 1:].partition(":")
        env, sep, problem = rest.partition(":")
        if key == f"{store.prefix}:index":
            n += 1 + len(members(store, entries))
        elif kind == "kernel":
            continue
        elif kind in ("rows", "pick", "prov") and sep or kind == "env" and rest:
            plan.append((raw, key, kind, env, problem))
        else:
            n += 1
            entries.skip(shown(key), "not a key gemmtune writes under this prefix")
    if not plan:
        return n
    replies = _READ(store._client, [p[0] for p in plan], [*BOUNDS, *("all" if p[2] == "rows" else "get" for p in plan)])
    for (_, key, kind, env, problem), reply in zip(plan, replies):
        n += _check_entry(entries, key, kind, env, problem, reply)
    return n


def _check_entry(entries: Entries, key: str, kind: str, env: str, problem: str, reply: list) -> int:
    """Check one key's entries (a rows hash: each field); returns how many entries it holds."""
    from .redis_codec import _mark, read_rows

    if kind == "rows":
        rows, _, raw, _ = read_rows(entries, key, env, problem, reply)
        for r in rows.values():
            why = catalog_fault(r, problem)
            if why is not None:
                entries.skip(f"{key} field {shown(json.dumps([r.template, r.config, r.runtime]))}", why)
        return max(len(raw), 1)
    if kind == "pick":
        got = _read_value(entries, key, reply, _pick, lambda p: entry.pick_parts(env, problem, p[1], p[0]))
        why = catalog_fault(got[0][0], problem) if got is not None else None
        if why is not None:
            entries.skip(key, why)
    elif kind == "prov":
        _read_value(entries, key, reply, _mark, lambda m: entry.mark_parts(env, problem, m))
    else:
        _read_value(entries, key, reply, _info, lambda obj: entry.info_parts(env, obj))
    return 1
