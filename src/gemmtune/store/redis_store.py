"""A store a fleet shares: Redis (`--store redis://HOST:PORT/DB`, `rediss://…`, `GEMMTUNE_STORE`).

The semantics are the SQLite store's (`store.sqlite`), on one server:

- keys are `PREFIX:rows|pick|prov:ENV:PROBLEM` (`?prefix=NAME` in the URL, default `gemmtune`, keeps
  fleets apart), plus `PREFIX:env:ENV`, the index `PREFIX:index` and, with `share_kernels`, one hash
  `PREFIX:kernel:KEY` per compiled kernel (`store.kernels`);
- one hash field per choice; a row already there with the same `src_hash` wins, a stale one is
  replaced; the first writer of a pick wins.  A save is one Lua script, so it is atomic: racing
  processes agree on one pick, and a process killed mid-save leaves all of it or none;
- a password comes from the URL or `GEMMTUNE_REDIS_PASSWORD`, and is never printed (`path` is the
  URL with the password replaced by `***`).

Faults: every call has a timeout (`?timeout=SECONDS`, default 0.25).  An unreachable or failing
server never fails a tune: the store warns once per outage and keeps picks in this process's memory;
each later call tries the server again (at most once a second), and when it answers, the picks made
meanwhile are written to it first.  A problem whose pick was read is kept in this process's memory,
so a warm lookup never waits for the server.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
import time
import warnings
from typing import Any, Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..core.errors import SettingsError
from .keys import Row, Stored, canon
from .trust import Trust
from .views import StoreViews

log = logging.getLogger("gemmtune")

SCHEMES = ("redis", "rediss")
PASSWORD_ENV = "GEMMTUNE_REDIS_PASSWORD"
RETRY_S = 1.0

# KEYS: rows, pick, provisional mark, env, index.  ARGV: env info, pick, replace ("1": always, "0":
# never, else the JSON [template, src_hash, config, runtime] of the only pick it may replace), run id
# (or ""), index member, time, then (field, row) pairs.
SAVE = """
redis.call('SETNX', KEYS[4], ARGV[1])
for i = 7, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  local write = not old
  if old then
    local o, n = cjson.decode(old), cjson.decode(ARGV[i + 1])
    write = o.src_hash ~= n.src_hash or (o.status == 'not_benchmarked' and n.status ~= 'not_benchmarked')
  end
  if write then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
local written = 0
if ARGV[3] == '1' then redis.call('SET', KEYS[2], ARGV[2]); written = 1
elseif ARGV[3] == '0' then written = redis.call('SETNX', KEYS[2], ARGV[2])
else
  local cur, want = redis.call('GET', KEYS[2]), cjson.decode(ARGV[3])
  local c = cur and cjson.decode(cur)
  if not cur or (c.template == want[1] and c.src_hash == want[2] and c.config == want[3] and c.runtime == want[4]) then
    redis.call('SET', KEYS[2], ARGV[2]); written = 1
  end
end
if written == 1 then
  redis.call('DEL', KEYS[3])
  if ARGV[4] ~= '' then redis.call('SET', KEYS[3], ARGV[4]) end
  redis.call('ZADD', KEYS[5], ARGV[6], ARGV[5])
end
return redis.call('GET', KEYS[2])
"""


def is_redis_url(location: str | None) -> bool:
    """Whether a store location names a Redis server.

    Example:
        >>> is_redis_url("redis://localhost:6379/0"), is_redis_url("REDISS://h/1"), is_redis_url("x.sqlite")
        (True, True, False)
    """
    return isinstance(location, str) and location.split("://", 1)[0].lower() in SCHEMES and "://" in location


def redact(url: str) -> str:
    """The URL as it may be printed: no password.

    Example:
        >>> redact("redis://:s3cret@db:6379/2?prefix=team"), redact("redis://user:pw@db/0")
        ('redis://:***@db:6379/2?prefix=team', 'redis://user:***@db/0')
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def parse(url: str) -> tuple[str, str, float]:
    """(the URL for the client, key prefix, timeout in seconds); gemmtune's own query options removed.

    Example:
        >>> parse("redis://db:6379/3?prefix=fleet-a&timeout=0.5")
        ('redis://db:6379/3', 'fleet-a', 0.5)
    """
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    prefix = query.pop("prefix", "gemmtune")
    raw = query.pop("timeout", "0.25")
    try:
        timeout = float(raw)
    except ValueError:
        timeout = math.nan
    if not (0 < timeout <= 60):
        raise SettingsError(f"store: timeout in {redact(url)} must be a number of seconds in (0, 60], got {raw!r}")
    if not prefix or any(c in prefix for c in " :*?[]"):
        raise SettingsError(f"store: prefix in {redact(url)} must be a non-empty name without spaces, ':' "
                            f"or glob characters, got {prefix!r}")
    return urlunsplit(parts._replace(query=urlencode(query))), prefix, timeout


def _client(url: str, timeout: float) -> Any:
    try:
        import redis
    except ImportError:
        raise SettingsError("store: a redis:// store needs the redis client: pip install 'gemmtune[redis]'") from None
    password = None if urlsplit(url).password else os.environ.get(PASSWORD_ENV) or None
    try:
        return redis.Redis.from_url(url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout,
                                    decode_responses=True)
    except ValueError as exc:
        raise SettingsError(f"store: {redact(url)}: {exc}") from None


def _ms(value: float | None) -> float | str | None:
    return value if value is None or math.isfinite(value) else str(value)


def _from_ms(value: Any) -> float | None:
    return float(value) if isinstance(value, str) else value


def _field(row: Row) -> str:
    return json.dumps([row.template, row.config, row.runtime])


def _value(row: Row, now: float) -> str:
    return json.dumps({"src_hash": row.src_hash, "ms": _ms(row.ms), "status": row.status, "stage": row.stage,
                       "recorded": now}, allow_nan=False)


def _row(field: str, value: str) -> Row:
    template, config, runtime = json.loads(field)
    v = json.loads(value)
    return Row(template, v["src_hash"], config, runtime, _from_ms(v["ms"]), v["status"], v["stage"])


def _pick(value: str) -> Row:
    p = json.loads(value)
    return Row(p["template"], p["src_hash"], p["config"], p["runtime"], _from_ms(p["ms"]), "ok", p["strategy"])


class RedisStore(StoreViews):
    """The store on a Redis server (see the module's docstring for the keys and the faults).

    Example:
        >>> store = RedisStore("redis://127.0.0.1:1/0?timeout=0.05")     # doctest: +SKIP
        >>> store.load("env", "problem").pick is None                      # doctest: +SKIP
        True
    """

    shared = True  # a pick read from it is checked on first use in a process (engine)

    def __init__(self, url: str, client: Any = None, trust: Trust | None = None):
        from .sqlite import Store

        self.trust = trust if trust is not None else Trust()
        self.path = self.origin = redact(url)
        self.warnings: list[str] = []
        clean, self.prefix, self.timeout = parse(url)
        self._client = client if client is not None else _client(clean, self.timeout)
        self._save_script = self._client.register_script(SAVE)
        self._memory = Store(":memory:")  # picks made while the server does not answer
        self._pending: list[tuple] = []  # ... and their saves, written to the server when it is back
        self._seen: dict[tuple[str, str], Stored] = {}  # settled picks read or written by this process
        self._down_until: float | None = None
        self._replaying = threading.Lock()  # compile threads read kernels too: one replay of the missed saves

    def _key(self, kind: str, env: str, problem: str = "") -> str:
        return f"{self.prefix}:{kind}:{env}:{problem}" if problem else f"{self.prefix}:{kind}:{env}"

    @property
    def reachable(self) -> bool:
        """False while this process keeps picks in memory because the server did not answer."""
        return self._down_until is None

    # -- the server, or memory while it does not answer ------------------------------------------
    def _server(self, remote: Callable[[], Any], local: Callable[[], Any]) -> Any:
        import redis

        if self._down_until is not None and time.monotonic() < self._down_until:
            return local()
        try:
            with self._replaying:
                while self._pending:  # the server is back: first the saves it missed, in order
                    self._remote_save(*self._pending[0])
                    self._pending.pop(0)
            out = remote()
        except redis.RedisError as exc:
            self._went_down(exc)
            return local()
        if self._down_until is not None:
            log.warning("gemmtune: redis store %s answers again", self.path)
        self._down_until = None
        return out

    def _went_down(self, exc: BaseException) -> None:
        if self._down_until is None:
            msg = (f"redis store {self.path} did not answer ({type(exc).__name__}: {exc}); keeping picks in this "
                   "process until it does (they are written to it then)")
            self.warnings.append(msg)
            warnings.warn(f"gemmtune: {msg}", RuntimeWarning, stacklevel=5)
        self._down_until = time.monotonic() + RETRY_S

    # -- reading and writing ---------------------------------------------------------------------
    def load(self, env: str, problem: str) -> Stored:
        """The stored rows and pick of one problem (this process's memory first; never raises)."""
        seen = self._seen.get((env, problem))
        if seen is not None:
            return seen
        stored = self._server(lambda: self._remote_load(env, problem), lambda: self._memory.load(env, problem))
        if stored.pick is not None and stored.provisional is None and self.reachable:
            self._seen[(env, problem)] = stored
        return stored

    def _remote_load(self, env: str, problem: str) -> Stored:
        pipe = self._client.pipeline(transaction=False)
        pipe.hgetall(self._key("rows", env, problem))
        pipe.get(self._key("pick", env, problem))
        pipe.get(self._key("prov", env, problem))
        rows, pick, mark = pipe.execute()
        return Stored(tuple(_row(f, v) for f, v in sorted(rows.items())), _pick(pick) if pick else None,
                      mark if pick else None)

    def save(self, env: str, info: dict[str, Any], problem: str, describe: str, rows: list[Row],
             pick: Row, replace_pick: bool | Row, provisional: str | None = None) -> Row:
        """Record `rows` and the pick atomically (same-hash rows already there win; the first pick wins
        unless `replace_pick`: True, or the Row of the only pick it may replace); returns the stored pick."""
        self._seen.pop((env, problem), None)
        args = (env, info, problem, describe, rows, pick, replace_pick, provisional)

        def local() -> Row:
            self._pending.append(args)
            return self._memory.save(*args)

        return self._server(lambda: self._remote_save(*args), local)

    def _remote_save(self, env: str, info: dict[str, Any], problem: str, describe: str, rows: list[Row],
                     pick: Row, replace_pick: bool | Row, provisional: str | None) -> Row:
        now = time.time()
        pairs = [x for r in rows for x in (_field(r), _value(r, now))]
        pick_json = json.dumps({"describe": describe, "template": pick.template, "src_hash": pick.src_hash,
                                "config": pick.config, "runtime": pick.runtime, "ms": _ms(pick.ms),
                                "strategy": pick.stage, "recorded": now}, allow_nan=False)
        keys = [self._key(k, env, problem) for k in ("rows", "pick", "prov")]
        keys += [self._key("env", env), f"{self.prefix}:index"]
        mode = (("1" if replace_pick else "0") if isinstance(replace_pick, bool) else
                json.dumps([replace_pick.template, replace_pick.src_hash, replace_pick.config, replace_pick.runtime]))
        stored = self._save_script(keys=keys, args=[canon(info), pick_json, mode,
                                                    provisional or "", json.dumps([env, problem]), now, *pairs])
        return _pick(stored)

    def forget(self, env: str, problem: str, row: Row) -> None:
        """Drop a problem's pick and the timing row of the choice it names (a pick found wrong)."""
        self._seen.pop((env, problem), None)

        def remote() -> None:
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(self._key("pick", env, problem), self._key("prov", env, problem))
            pipe.hdel(self._key("rows", env, problem), _field(row))
            pipe.zrem(f"{self.prefix}:index", json.dumps([env, problem]))
            pipe.execute()

        self._server(remote, lambda: self._memory.forget(env, problem, row))

    # -- compiled kernels (`store.kernels`, `share_kernels`): one hash per key, contents in base64 -----
    def kernel_files(self, key: str) -> dict[str, bytes]:
        """The files kept under a compiler cache's `key` (name -> contents; also the in-model verdicts,
        `dispatch.verdicts`); {} when none or unreachable."""
        got = self._server(lambda: self._client.hgetall(f"{self.prefix}:kernel:{key}"), dict)
        return {name: base64.b64decode(data) for name, data in got.items()}

    def has_kernel_files(self, key: str) -> bool:
        """Whether anything is kept under `key` (unreachable: False)."""
        return bool(self._server(lambda: self._client.exists(f"{self.prefix}:kernel:{key}"), lambda: 0))

    def put_kernel_files(self, key: str, files: dict[str, bytes]) -> None:
        """Keep `files` under `key`; a file already kept there stays as it is (unreachable: not kept)."""
        def remote() -> None:
            pipe = self._client.pipeline(transaction=False)
            for name, data in files.items():
                pipe.hsetnx(f"{self.prefix}:kernel:{key}", name, base64.b64encode(data).decode())
            pipe.execute()

        self._server(remote, lambda: None)

    # -- management (the `gemmtune cache` commands) ----------------------------------------------
    def problems(self) -> list[dict[str, Any]]:
        """Every stored pick, oldest first (`gemmtune cache ls`)."""
        return self._server(self._remote_problems, self._memory.problems)

    def _remote_problems(self) -> list[dict[str, Any]]:
        members = [json.loads(m) for m in self._client.zrange(f"{self.prefix}:index", 0, -1)]
        pipe = self._client.pipeline(transaction=False)
        for env, problem in members:
            pipe.get(self._key("pick", env, problem))
            pipe.hlen(self._key("rows", env, problem))
            pipe.get(self._key("env", env))
        got = pipe.execute()
        out = []
        for i, (env, problem) in enumerate(members):
            pick, count, info = got[3 * i: 3 * i + 3]
            if not pick:  # cleared meanwhile
                continue
            p = json.loads(pick)
            out.append(dict(problem=problem, describe=p["describe"], template=p["template"],
                            config=json.loads(p["config"]), runtime_params=json.loads(p["runtime"]),
                            ms=_from_ms(p["ms"]), env=env, env_info=json.loads(info or "{}"), timings=count))
        return out

    def clear(self) -> int:
        """Remove every key under this store's prefix; returns how many picks there were."""
        self._seen.clear()
        return self._server(self._remote_clear, self._memory.clear)

    def _remote_clear(self) -> int:
        n = int(self._client.zcard(f"{self.prefix}:index"))
        batch = []
        for key in self._client.scan_iter(match=f"{self.prefix}:*", count=500):
            batch.append(key)
            if len(batch) == 500:
                self._client.unlink(*batch)
                batch = []
        if batch:
            self._client.unlink(*batch)
        return n

    def close(self) -> None:
        self._client.close()
        self._memory.close()
