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

The URL (`store.redis_url`): `?prefix=`, `?timeout=`, credentials and TLS options; anything else is
refused in one line.  Faults (`store.redis_faults`): every call has a timeout (`?timeout=SECONDS`,
default 0.25).  An unreachable or refusing server never fails a tune: the store warns once per
outage, naming the cause, and keeps picks in this process's memory; each later call tries the server
again (at most once a second), and when it answers, the picks made meanwhile are written to it first.
A save the server refuses on its own is dropped with a warning; saves still queued at exit are tried
once more, or reported lost.  A problem whose pick was read is kept in this process's memory, so a
warm lookup never waits for the server.
"""

from __future__ import annotations

import atexit
import base64
import json
import logging
import re
from typing import Any

from . import redis_codec, redis_listing
from .entry import Entries
from .keys import Row, Stored
from .redis_faults import ServerOrMemory
from .redis_url import PASSWORD_ENV, SCHEMES, connect, is_redis_url, parse, redact
from .trust import Trust
from .views import StoreViews

__all__ = ["PASSWORD_ENV", "SCHEMES", "RedisStore", "is_redis_url", "parse", "redact"]

log = logging.getLogger("gemmtune")

def glob_escape(text: str) -> str:
    r"""`text` as a literal in a Redis glob pattern (`SCAN MATCH`, `KEYS`): `*?[]\\` escaped.

    Example:
        >>> glob_escape("team\\"), glob_escape("a*b?[c]")
        ('team\\\\', 'a\\*b\\?\\[c\\]')
    """
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


class RedisStore(ServerOrMemory, StoreViews):
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
        self._client = client if client is not None else connect(clean, self.timeout)
        self.entries = Entries(self)  # entries read through the schema (store.entry); the bad ones counted
        self.bad_entries = self.entries.bad
        self._memory = Store(":memory:")  # picks made while the server cannot be used (their saves: queued)
        self._seen: dict[tuple[str, str], Stored] = {}  # settled picks read or written by this process
        self._init_faults()  # the queue of saves, the outage, strict mode (`store.redis_faults`)

    def _key(self, kind: str, env: str, problem: str = "") -> str:
        return f"{self.prefix}:{kind}:{env}:{problem}" if problem else f"{self.prefix}:{kind}:{env}"

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
        return redis_codec.load(self, env, problem)

    def save(self, env: str, info: dict[str, Any], problem: str, describe: str, rows: list[Row],
             pick: Row, replace_pick: bool | Row, provisional: str | None = None) -> Row:
        """Record `rows` and the pick atomically (same-hash rows already there win; the first pick wins
        unless `replace_pick`: True, or the Row of the only pick it may replace); returns the stored pick."""
        self._seen.pop((env, problem), None)
        args = (env, info, problem, describe, rows, pick, replace_pick, provisional)

        def local() -> Row:
            self._queue(args)
            return self._memory.save(*args)

        def refused(cause: str) -> Row:  # a save the server cannot take: kept here (and served), never queued
            self._refused(args, cause)
            kept = self._memory.save(*args)
            self._seen[(env, problem)] = self._memory.load(env, problem)
            return kept

        return self._server(lambda: self._remote_save(*args), local, refused)

    def _remote_save(self, env: str, info: dict[str, Any], problem: str, describe: str, rows: list[Row],
                     pick: Row, replace_pick: bool | Row, provisional: str | None) -> Row:
        stored = redis_codec.save(self, env, info, problem, describe, rows, pick, replace_pick, provisional)
        return stored if stored is not None else pick

    def forget(self, env: str, problem: str, row: Row) -> None:
        """Drop a problem's pick and the timing row of the choice it names (a pick found wrong)."""
        self._seen.pop((env, problem), None)

        def remote() -> None:
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(self._key("pick", env, problem), self._key("prov", env, problem))
            pipe.hdel(self._key("rows", env, problem), redis_codec.field(row))
            pipe.zrem(f"{self.prefix}:index", json.dumps([env, problem]))
            pipe.execute()

        self._server(remote, lambda: self._memory.forget(env, problem, row))

    # -- compiled kernels (`store.kernels`, `share_kernels`): one hash per key, contents in base64 -----
    def kernel_files(self, key: str) -> dict[str, bytes]:
        """The files kept under a compiler cache's `key` (name -> contents; also the in-model verdicts,
        `dispatch.verdicts`), within the bounds and, with a key, signed (`store.kernel_entries`); {} when
        none or unreachable."""
        from .kernel_entries import verified

        entries = self._kernel_entries(key)[0]
        return verified(self.trust.signer, key, entries, self.path)

    def _kernel_entries(self, key: str) -> tuple[dict[str, bytes], bool]:
        from . import redis_kernels
        from .kernel_entries import skip

        def refused(cause: str) -> tuple[dict[str, bytes], bool]:  # e.g. the key holds another type
            skip(self.path, key, "malformed", cause)
            return {}, False

        return self._server(lambda: redis_kernels.read(self._client, f"{self.prefix}:kernel:{key}", self.path, key),
                            lambda: ({}, False), refused)

    def has_kernel_files(self, key: str) -> bool:
        """Whether anything is kept under `key` (unreachable: False); with a key, whether every file
        there verifies (else a writer with the key writes it again: `put_kernel_files`)."""
        from .kernel_entries import whole

        if self.trust.signer is None:
            return bool(self._server(lambda: self._client.exists(f"{self.prefix}:kernel:{key}"), lambda: 0))
        return whole(self.trust.signer, key, *self._kernel_entries(key))

    def put_kernel_files(self, key: str, files: dict[str, bytes]) -> None:
        """Keep `files` under `key`, signed where the store has a key; a file already kept there stays
        as it is (the first writer wins), unless it does not verify under the key (unreachable: not kept)."""
        from . import redis_kernels

        self._server(lambda: redis_kernels.write(self._client, f"{self.prefix}:kernel:{key}", key, files,
                                                 self.trust.signer, self.path), lambda: None, lambda cause: None)

    # -- management (the `gemmtune cache` commands) ----------------------------------------------
    def problems(self) -> list[dict[str, Any]]:
        """Every stored pick, oldest first (`gemmtune cache ls`)."""
        return self._server(self._remote_problems, self._memory.problems)

    def _remote_problems(self) -> list[dict[str, Any]]:
        return redis_listing.problems(self)

    def check(self) -> tuple[int, list[tuple[str, str]]]:
        """Every entry under the prefix read through the schema (`gemmtune cache check`, in `strictly`):
        (how many were read, the bad ones as (key, why))."""
        checker = Entries(self, keep=None)
        checker.quiet = True
        pattern = f"{glob_escape(self.prefix)}:*"
        return self._server(lambda: redis_listing.check(self, checker, pattern), lambda: 0), checker.bad

    def clear(self) -> int:
        """Remove every key under this store's prefix; returns how many picks there were."""
        self._seen.clear()
        return self._server(self._remote_clear, self._memory.clear)

    def _remote_clear(self) -> int:
        n = int(self._client.zcard(f"{self.prefix}:index"))
        batch = []
        for key in self._client.scan_iter(match=f"{glob_escape(self.prefix)}:*", count=500):
            batch.append(key)
            if len(batch) == 500:
                self._client.unlink(*batch)
                batch = []
        if batch:
            self._client.unlink(*batch)
        return n

    def close(self) -> None:
        """Write the queued saves, or report them lost (`flush`), and close the connections."""
        if self._exit_hook:
            self.flush()
            atexit.unregister(self.flush)
            self._exit_hook = False
        self._client.close()
        self._memory.close()
