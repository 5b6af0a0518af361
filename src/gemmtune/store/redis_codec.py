"""The Redis store's values and scripts: what is read goes through the schema (`store.entry`), bounded
on the server, and what is written is signed (with a key).  The scripts decode no JSON.

Values (one JSON object each, with "sig" when signed):

- a row: hash field `["template", "config", "runtime"]` (JSON), value {src_hash, ms, status, stage, recorded};
- a pick: {describe, template, src_hash, config, runtime, ms, strategy, recorded};
- a provisional mark: "RUN@TIME", then " SIG" when signed; env info: its JSON object (+ "sig");
- an index member: JSON [env, problem] (not signed: the pick it leads to is);
- with a key, the rows hash's field `sig` (`WHOLE`) signs the hash as a whole once a writer verified
  every row of it (`sign_rows`): a reader then checks all its rows with one MAC (a row's own "sig"
  where the hash changed since).

Reads (`READ`): the server measures every value first (STRLEN; a hash: HLEN and MEMORY USAGE) and
sends a value over the bounds as its size only, so a planted huge value never reaches this process.
Replies are never decoded by the client: invalid UTF-8 is a bad entry, not an error.

Saves (`SAVE`): this process reads the entries a save touches, decides here which ones it replaces
(`entry.replaces`; a bad entry as if absent; the first pick wins), and the script writes each one only
while the server still holds what was read (compared by SHA-1, or by size): a compare-and-set per
entry, one atomic script, no JSON decoded on the server.  A rows hash over the bounds (or of another
type) is dropped by the save, as readers refuse it whole.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from typing import Any, Iterable

from . import entry
from .entry import MAX_ENTRY_BYTES, MAX_PROBLEM_BYTES, MAX_PROBLEM_ROWS, BadEntry, Entries, shown
from .keys import Row, Stored, canon

__all__ = ["READ", "SAVE", "Lua", "field", "load", "save"]

BOUNDS = (str(MAX_ENTRY_BYTES), str(MAX_PROBLEM_BYTES), str(MAX_PROBLEM_ROWS))
WHOLE = b"sig"  # the rows hash's field that signs the whole hash (`sign_rows`): never a row's field
WHOLE_ROWS = 4  # fewer rows are verified one by one (as cheap)

# KEYS: any; ARGV: the bounds (value bytes, hash bytes, hash fields), then per key what to read:
# 'get' (a string), 'all' (a hash), 'len' (a hash's length).  Per key: {'none'}, {'type', T},
# {'size', N}, {'value', V}, {'hash', {f1, v1, ...}} or {'len', N}.
READ = """
local vmax, hmax, nmax = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i, key in ipairs(KEYS) do
  local op, t = ARGV[3 + i], redis.call('TYPE', key).ok
  if t == 'none' then out[i] = {'none'}
  elseif op == 'get' then
    if t ~= 'string' then out[i] = {'type', t}
    else
      local n = redis.call('STRLEN', key)
      if n > vmax then out[i] = {'size', n} else out[i] = {'value', redis.call('GET', key)} end
    end
  elseif t ~= 'hash' then out[i] = {'type', t}
  elseif op == 'len' then out[i] = {'len', redis.call('HLEN', key) - redis.call('HEXISTS', key, 'sig')}
  else
    local n = redis.call('HLEN', key)
    local m = n <= nmax and (redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0') or 0) or 0
    if n > nmax or m > hmax then out[i] = {'size', m, n} else out[i] = {'hash', redis.call('HGETALL', key)} end
  end
end
return out
"""

# KEYS: rows, pick, provisional mark, env, index.  ARGV: the bounds; env info and the state it
# replaces; the pick and the state it replaces; the mark (or ''); the index member; the time; then
# (field, row, state) triples.  A state: '-' absent, '*' anything, '!' write nothing, 'type:T',
# 'size:N', else the SHA-1 of the value read.  Returns the stored pick (nil when it is not a string
# within the bound).
SAVE = """
local vmax, hmax, nmax = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local function state(key)
  local t = redis.call('TYPE', key).ok
  if t == 'none' then return '-' end
  if t ~= 'string' then return 'type:' .. t end
  local n = redis.call('STRLEN', key)
  if n > vmax then return 'size:' .. n end
  return redis.sha1hex(redis.call('GET', key))
end
local function put(key, value, want)
  if want == '!' then return 0 end
  if want ~= '*' and state(key) ~= want then return 0 end
  redis.call('SET', key, value)
  return 1
end
put(KEYS[4], ARGV[4], ARGV[5])
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'none' and (t ~= 'hash' or redis.call('HLEN', KEYS[1]) > nmax
                    or (redis.call('MEMORY', 'USAGE', KEYS[1], 'SAMPLES', '0') or 0) > hmax) then
  redis.call('DEL', KEYS[1])
end
for i = 11, #ARGV, 3 do
  local f, cur = ARGV[i], '-'
  if redis.call('HEXISTS', KEYS[1], f) == 1 then
    local n = redis.call('HSTRLEN', KEYS[1], f)
    if n > vmax then cur = 'size:' .. n else cur = redis.sha1hex(redis.call('HGET', KEYS[1], f)) end
  end
  if cur == ARGV[i + 2] then redis.call('HSET', KEYS[1], f, ARGV[i + 1]) end
end
if put(KEYS[2], ARGV[6], ARGV[7]) == 1 then
  redis.call('DEL', KEYS[3])
  if ARGV[8] ~= '' then redis.call('SET', KEYS[3], ARGV[8]) end
  local it = redis.call('TYPE', KEYS[5]).ok
  if it == 'none' or it == 'zset' then redis.call('ZADD', KEYS[5], ARGV[10], ARGV[9]) end
end
if redis.call('TYPE', KEYS[2]).ok ~= 'string' or redis.call('STRLEN', KEYS[2]) > vmax then return false end
return redis.call('GET', KEYS[2])
"""


class Lua:
    """A script called by its digest (loaded on the first NOSCRIPT); its replies are never decoded."""

    def __init__(self, text: str):
        self.text, self.sha = text, hashlib.sha1(text.encode()).hexdigest()

    def __call__(self, client: Any, keys: list[str], args: Iterable[Any]) -> Any:
        import redis

        argv = [len(keys), *keys, *args]
        try:
            return client.execute_command("EVALSHA", self.sha, *argv, NEVER_DECODE=True)
        except redis.exceptions.NoScriptError:
            client.execute_command("SCRIPT", "LOAD", self.text)
            return client.execute_command("EVALSHA", self.sha, *argv, NEVER_DECODE=True)


_READ, _SAVE = Lua(READ), Lua(SAVE)


# -- values written ------------------------------------------------------------------------------
def field(row: Row) -> str:
    """The hash field of a row: JSON [template, config, runtime]."""
    return json.dumps([row.template, row.config, row.runtime])


def _signed(obj: dict[str, Any], sig: str | None) -> str:
    if sig is not None:
        obj["sig"] = sig
    return json.dumps(obj, allow_nan=False)


def _row_value(row: Row, now: float, sig: str | None) -> str:
    return _signed({"src_hash": row.src_hash, "ms": row.ms, "status": row.status, "stage": row.stage,
                    "recorded": now}, sig)


def _pick_value(describe: str, pick: Row, now: float, sig: str | None) -> str:
    return _signed({"describe": describe, "template": pick.template, "src_hash": pick.src_hash, "config": pick.config,
                    "runtime": pick.runtime, "ms": pick.ms, "strategy": pick.stage, "recorded": now}, sig)


# -- values read ---------------------------------------------------------------------------------
def _text(raw: Any, what: str) -> str:
    if not isinstance(raw, bytes):
        raise BadEntry(f"{what} is not a value")
    if len(raw) > MAX_ENTRY_BYTES:
        raise BadEntry(f"{what} is {len(raw)} bytes long (at most {MAX_ENTRY_BYTES})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadEntry(f"{what} is not UTF-8 text") from None


def _object(raw: Any, what: str, keys: tuple[str, ...]) -> dict[str, Any]:
    text = _text(raw, what)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        raise BadEntry(f"{what} {shown(text, 40)} is not JSON") from None
    if not isinstance(obj, dict):
        raise BadEntry(f"{what} is a JSON {type(obj).__name__}, not an object")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise BadEntry(f"{what} lacks {', '.join(missing)}")
    return obj


def _row(f: bytes, v: bytes) -> tuple[Row, Any]:
    text = _text(f, "field")
    try:
        parts = json.loads(text)
    except (ValueError, RecursionError):
        raise BadEntry(f"field {shown(text, 40)} is not JSON") from None
    if not isinstance(parts, list) or len(parts) != 3 or json.dumps(parts) != text:
        raise BadEntry("field is not the JSON [template, config, runtime]")
    o = _object(v, "value", ("src_hash", "ms", "status", "stage"))
    return entry.row(parts[0], o["src_hash"], parts[1], parts[2], o["ms"], o["status"], o["stage"]), o.get("sig")


def _pick(raw: bytes) -> tuple[tuple[Row, str | None], Any]:
    o = _object(raw, "pick", ("template", "src_hash", "config", "runtime", "ms", "strategy"))
    pick = entry.pick(o["template"], o["src_hash"], o["config"], o["runtime"], o["ms"], o["strategy"])
    return (pick, entry.describe(o.get("describe"))), o.get("sig")


def _mark(raw: bytes) -> tuple[str, str | None]:
    text = _text(raw, "provisional mark")
    mark, _, sig = text.partition(" ")
    return entry.mark(mark), sig or None


def _info(raw: bytes) -> tuple[dict[str, Any], Any]:
    obj = entry.info(_text(raw, "env info"))
    sig = obj.pop("sig", None)
    return obj, sig


def _refusal(reply: list) -> str | None:
    """Why a READ reply holds no value ('none', another type, over the bounds), or None."""
    kind = reply[0]
    if kind == b"type":
        return f"it holds a {reply[1].decode(errors='replace')}, not what gemmtune writes there"
    if kind == b"size":
        return (f"it is over the size bounds ({reply[1]} bytes"
                + (f", {reply[2]} fields" if len(reply) > 2 else "") + ")")
    return None


def state(reply: list) -> str:
    """What a save expects the server to still hold of a value it read (see SAVE)."""
    kind = reply[0]
    if kind == b"none":
        return "-"
    if kind == b"type":
        return "type:" + reply[1].decode(errors="replace")
    if kind == b"size":
        return f"size:{reply[1]}"
    return _digest(reply[1])


def _digest(raw: bytes) -> str:
    return f"size:{len(raw)}" if len(raw) > MAX_ENTRY_BYTES else hashlib.sha1(raw).hexdigest()


def rows_digest(raw: dict[bytes, bytes], fields: list[bytes] | None = None) -> str:
    """SHA-256 of a rows hash exactly as stored: its fields and values, sorted (`fields`: sorted
    already), after all their lengths."""
    fields = fields if fields is not None else sorted(raw)
    values = [raw[f] for f in fields]
    head = struct.pack(f">I{2 * len(fields)}I", len(fields), *map(len, fields), *map(len, values))
    return hashlib.sha256(head + b"".join(fields) + b"".join(values)).hexdigest()


def read_rows(entries: Entries, key: str, env: str, problem: str, reply: list
              ) -> tuple[dict[Any, Row], dict[Any, str], dict[bytes, bytes], bool]:
    """(good rows by choice key, their signatures, every raw field and value, whether refused whole).
    With a key, the rows are verified at once when the hash's `WHOLE` field signs the hash as it is
    (`sign_rows`); else one by one."""
    why = _refusal(reply)
    if why is not None:
        entries.skip(key, why)
        return {}, {}, {}, True
    if reply[0] != b"hash":
        return {}, {}, {}, False
    flat = reply[1]
    raw = dict(zip(flat[0::2], flat[1::2]))
    whole = raw.pop(WHOLE, None)
    fields = sorted(raw)
    rows: dict[Any, Row] = {}
    sigs: dict[Any, str] = {}
    check = entries.row_check(env, problem, len(raw))
    if check is not None and whole is not None and entries.signer.verify(
            whole.decode(errors="replace"), "rows", env, problem, rows_digest(raw, fields)):
        check = None  # a writer with the key verified every row of the hash as it stands
    for f in fields:  # (`Entries.read_signed`, inlined: a problem may have thousands of rows)
        try:
            r, sig = _row(f, raw[f])
        except BadEntry as exc:
            entries.skip(f"{key} field {shown(f.decode(errors='replace'))}", str(exc))
            continue
        if check is not None and not check(r, sig):
            entries.unverified(f"{key} field {shown(f.decode(errors='replace'))}", sig)
            continue
        rows[r.choice_key] = r
        if isinstance(sig, str):
            sigs[r.choice_key] = sig
    return rows, sigs, raw, False


def _read_value(entries: Entries, key: str, reply: list, parse: Any, parts: Any) -> tuple[Any, Any] | None:
    """(entry, signature) of a READ reply for a string key, or None (absent or bad: skipped)."""
    why = _refusal(reply)
    if why is not None:
        entries.skip(key, why)
        return None
    if reply[0] != b"value":
        return None
    return entries.read_signed(lambda: key, lambda: parse(reply[1]), parts)


def load(store: Any, env: str, problem: str) -> Stored:
    """The good rows, pick and provisional mark of one problem on the server (one round trip)."""
    keys = [store._key(k, env, problem) for k in ("rows", "pick", "prov")]
    rows_r, pick_r, mark_r = _READ(store._client, keys, [*BOUNDS, "all", "get", "get"])
    rows, sigs, _, _ = read_rows(store.entries, keys[0], env, problem, rows_r)
    got = _read_value(store.entries, keys[1], pick_r, _pick, lambda p: entry.pick_parts(env, problem, p[1], p[0]))
    pick = got[0][0] if got is not None else None
    if got is not None and isinstance(got[1], str):
        sigs["pick"] = got[1]
    mark = None
    if pick is not None:
        marked = _read_value(store.entries, keys[2], mark_r, _mark, lambda m: entry.mark_parts(env, problem, m))
        mark = marked[0] if marked is not None else None
    return Stored(tuple(rows.values()), pick, mark, sigs or None)


def save(store: Any, env: str, info: dict[str, Any], problem: str, describe: str, rows: list[Row], pick: Row,
         replace_pick: bool | Row, provisional: str | None) -> Row | None:
    """Write rows and the pick (see `RedisStore.save` and the module); returns the stored pick when it
    is good (None: a bad one was left there, the caller keeps its own)."""
    entries, now = store.entries, time.time()
    keys = [store._key(k, env, problem) for k in ("rows", "pick", "prov")] + [store._key("env", env),
                                                                             f"{store.prefix}:index"]
    rows_r, pick_r, env_r = _READ(store._client, [keys[0], keys[1], keys[3]], [*BOUNDS, "all", "get", "get"])
    current, _, raw, _ = read_rows(entries, keys[0], env, problem, rows_r)
    triples: list[str] = []
    for r in map(entry.storable, rows):
        f = field(r)
        old = raw.get(f.encode())
        if old is None or entry.replaces(current.get(r.choice_key), r):
            triples += [f, _row_value(r, now, entries.sign(entry.row_parts(env, problem, r))),
                        "-" if old is None else _digest(old)]
    good_env = _read_value(entries, keys[3], env_r, _info, lambda obj: entry.info_parts(env, obj))
    env_want = "!" if good_env is not None else state(env_r)
    pick = entry.storable(pick)
    pick_value = _pick_value(describe, pick, now, entries.sign(entry.pick_parts(env, problem, describe, pick)))
    mark = provisional or ""
    if mark:
        sig = entries.sign(entry.mark_parts(env, problem, mark))
        mark = mark if sig is None else f"{mark} {sig}"
    args = [*BOUNDS, _info_value(info, entries.sign(entry.info_parts(env, dict(info)))), env_want, pick_value,
            _pick_state(entries, keys[1], env, problem, pick_r, replace_pick), mark, json.dumps([env, problem]),
            repr(now), *triples]
    stored = _SAVE(store._client, keys, args)
    sign_rows(store, env, problem)
    if stored is None:
        return None
    got = _read_value(entries, keys[1], [b"value", stored], _pick, lambda p: entry.pick_parts(env, problem, p[1], p[0]))
    return got[0][0] if got is not None else None


def _info_value(info: dict[str, Any], sig: str | None) -> str:
    return canon(info) if sig is None else canon({**info, "sig": sig})


def _pick_state(entries: Entries, key: str, env: str, problem: str, reply: list, replace_pick: bool | Row) -> str:
    """What a save expects of the stored pick to write its own: '*' (always), '-' (none there), the
    state of a bad one or of the one it may replace, else '!' (the stored pick stays)."""
    if replace_pick is True:
        return "*"
    if reply[0] != b"value":
        return state(reply)  # none ('-'), or another type or over the bound: replaced as bad
    got = entries.read(lambda: key, lambda: _pick(reply[1]), lambda p: entry.pick_parts(env, problem, p[1], p[0]))
    if got is None:
        return state(reply)
    cur, r = got[0], replace_pick
    if isinstance(r, Row) and (cur.template, cur.src_hash, cur.config, cur.runtime) == (
            r.template, r.src_hash, r.config, r.runtime):
        return state(reply)
    return "!"



def sign_rows(store: Any, env: str, problem: str) -> None:
    """With a key: sign the problem's rows hash as it stands (its `WHOLE` field), when it holds many
    rows and every one verifies one by one, so that a reader verifies them all at once (one MAC
    instead of one per row).  A hash changed since is told by its digest: its rows are then verified
    one by one, until the next save signs it again."""
    entries = store.entries
    if entries.signer is None:
        return
    key = store._key("rows", env, problem)
    [reply] = _READ(store._client, [key], [*BOUNDS, "all"])
    rows, _, raw, refused = read_rows(entries, key, env, problem, reply)
    if len(raw) >= WHOLE_ROWS and not refused and len(rows) == len(raw):
        store._client.hset(key, WHOLE, entries.signer.sign("rows", env, problem, rows_digest(raw)))
