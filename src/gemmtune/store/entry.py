"""One schema for every entry read from a store, SQLite and Redis alike (docs/RELIABILITY.md).

Every byte read from a store is untrusted input.  Each entry goes through these checks before any
layer above the store sees it:

- a timing row: `template` (printable text), `src_hash` (None or short text), `config` and `runtime`
  (canonical JSON objects of scalars: integers, finite numbers, booleans, null, short text), `ms`
  (None or a finite number >= 0), `status` (one of `STATUSES`), `stage` (None or short text);
- a pick: the same fields (its status is "ok"), its description and strategy;
- a provisional mark: "RUN@TIME"; env info: a JSON object; a Redis index member: JSON [env, problem];
- sizes: `MAX_ENTRY_BYTES` per stored value, `MAX_PROBLEM_ROWS` rows and `MAX_PROBLEM_BYTES` per
  problem.  The stores refuse oversized values before reading them (Redis: the server measures them;
  SQLite: `length()` in the query), so a planted huge value is never loaded into this process.

With a key (`Trust.signer`), an entry must also carry a signature over its kind, its environment and
problem, and its value (`*_parts`): an entry copied under another problem or kind does not verify.

A bad entry is never raised to the caller: it is skipped with one warning naming the store and the
key, and counted (`store.bad_entries`, listed by `gemmtune cache check`).  A skipped pick is no pick:
the problem is tuned again and the new pick replaces it (the stores replace a bad entry on write).

Whether a row's template and config can be built is decided where it is used: a stored row is only
ever matched against the current tune's candidates (`store.memory.recall`), so a row naming a template
or config that no candidate has is never used.  `gemmtune cache check` also checks each template and
config against gemmtune's shipped templates (`store.catalog`).

Example:
    >>> r = row("aten_mm", None, "{}", "{}", 1.5, "ok", "final")
    >>> r.ms, r.status
    (1.5, 'ok')
    >>> row("aten_mm", None, "{}", "{}", "fast", "ok", "final")
    Traceback (most recent call last):
    ...
    gemmtune.store.entry.BadEntry: ms is 'fast', not a number
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from typing import Any, Callable

from .keys import Row, canon

__all__ = ["BadEntry", "Entries", "MAX_ENTRY_BYTES", "MAX_PROBLEM_BYTES", "MAX_PROBLEM_ROWS", "STATUSES",
           "info", "mark", "member", "ms", "params", "pick", "row", "shown", "storable"]

log = logging.getLogger("gemmtune")

MAX_ENTRY_BYTES = 64 * 1024  # one stored value: a row's field or value, a pick, env info
MAX_PROBLEM_ROWS = 4096  # rows of one problem
MAX_PROBLEM_BYTES = 8 * 1024 * 1024  # all rows of one problem
MAX_KEY_CHARS = 1024  # an environment or problem key, a description
MAX_NAME_CHARS = 256  # template, src_hash, status, stage, a parameter's name or text value
MAX_MARK_CHARS = 128  # a provisional mark
MAX_PARAMS = 64  # names in one config or runtime
MAX_WARNINGS = 20  # per store: later bad entries are counted and listed by `gemmtune cache check`
MAX_KEPT = 1000  # bad entries a store keeps in `bad_entries`
STATUSES = frozenset({"ok", "compile_failed", "wrong_result", "run_failed", "not_benchmarked"})
NONE = "\x01"  # None in a signed part (never a valid text: it is not printable)
_GOOD_PARAMS: dict[str, bool] = {}  # config and runtime texts already found good (they repeat across problems)
_GOOD_NAMES: set[str] = set()  # names already found good (templates, statuses, stages, source hashes)


class BadEntry(ValueError):
    """An entry that fails the schema: the message says why, in words."""


def shown(value: Any, limit: int = 80) -> str:
    """`value` as a warning may print it: one line, escaped, at most `limit` characters.

    Example:
        >>> shown("a\\nb"), shown("x" * 100, 10)
        ("'a\\\\nb'", "'xxxxxxxxx…' (100 characters)")
    """
    if isinstance(value, str):
        text = repr(value[:limit - 1] + "…") + f" ({len(value)} characters)" if len(value) > limit else repr(value)
        return text
    return repr(value)[:limit]


def name(value: Any, what: str, limit: int = MAX_NAME_CHARS, empty: bool = False) -> str:
    """`value` when it is printable text of at most `limit` characters (empty only where allowed)."""
    if type(value) is str and value in _GOOD_NAMES and len(value) <= limit:
        return value
    if not isinstance(value, str):
        raise BadEntry(f"{what} is {type(value).__name__}, not text")
    if len(value) > limit:
        raise BadEntry(f"{what} is {len(value)} characters long (at most {limit})")
    if not value and not empty:
        raise BadEntry(f"{what} is empty")
    if not value.isprintable():
        raise BadEntry(f"{what} {shown(value)} has unprintable characters")
    if value and len(_GOOD_NAMES) < 65536:
        _GOOD_NAMES.add(value)
    return value


def _optional(value: Any, what: str, limit: int = MAX_NAME_CHARS) -> str | None:
    return None if value is None else name(value, what, limit, empty=True)


def ms(value: Any) -> float | None:
    """A stored time: None or a finite number >= 0 (as a float).

    Example:
        >>> ms(2), ms(None)
        (2.0, None)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadEntry(f"ms is {shown(value)}, not a number")
    try:
        v = float(value)
    except OverflowError:
        raise BadEntry("ms is too large a number") from None
    if not math.isfinite(v) or v < 0:
        raise BadEntry(f"ms is {v!r}, not a finite time >= 0")
    return v


def _scalar(value: Any, what: str) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > 2 ** 63:
            raise BadEntry(f"{what} is too large an integer")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise BadEntry(f"{what} is {value!r}, not a finite number")
    elif isinstance(value, str):
        name(value, what, empty=True)
    else:
        raise BadEntry(f"{what} is a JSON {type(value).__name__}, not a number or text")


def params(text: Any, what: str) -> str:
    """A config or runtime: canonical JSON (`keys.canon`) of an object of scalars, bounded in size.

    Example:
        >>> params('{"BLOCK_M":64}', "config")
        '{"BLOCK_M":64}'
        >>> params('{"BLOCK_M": [1]}', "config")
        Traceback (most recent call last):
        ...
        gemmtune.store.entry.BadEntry: config BLOCK_M is a JSON list, not a number or text
    """
    if isinstance(text, str) and text in _GOOD_PARAMS:
        return text
    if not isinstance(text, str):
        raise BadEntry(f"{what} is {type(text).__name__}, not text")
    if len(text) > MAX_ENTRY_BYTES:
        raise BadEntry(f"{what} is {len(text)} characters long (at most {MAX_ENTRY_BYTES})")
    obj = _json(text, what)
    if not isinstance(obj, dict):
        raise BadEntry(f"{what} is a JSON {type(obj).__name__}, not an object")
    if len(obj) > MAX_PARAMS:
        raise BadEntry(f"{what} has {len(obj)} names (at most {MAX_PARAMS})")
    for key, value in obj.items():
        name(key, f"a {what} name", 64)
        _scalar(value, f"{what} {key}")
    if canon(obj) != text:
        raise BadEntry(f"{what} {shown(text)} is not canonical JSON (sorted names, no spaces)")
    if len(_GOOD_PARAMS) < 65536:
        _GOOD_PARAMS[text] = True
    return text


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise BadEntry(f"{what} {shown(text, 40)} is not JSON") from None


def row(template: Any, src_hash: Any, config: Any, runtime: Any, ms_: Any, status: Any, stage: Any) -> Row:
    """A timing row whose every field passed the schema (else BadEntry)."""
    if type(status) is not str or status not in STATUSES:
        raise BadEntry(f"status is {shown(status)}, not one of {', '.join(sorted(STATUSES))}")
    return Row(name(template, "template"), _optional(src_hash, "src_hash"), params(config, "config"),
               params(runtime, "runtime"), ms(ms_), status, _optional(stage, "stage"))


def pick(template: Any, src_hash: Any, config: Any, runtime: Any, ms_: Any, strategy: Any) -> Row:
    """A pick (a row with status "ok" and the strategy that picked it in its stage)."""
    return row(template, src_hash, config, runtime, ms_, "ok", strategy)


def describe(value: Any) -> str | None:
    """A problem's description (None, or printable text)."""
    return _optional(value, "describe", MAX_KEY_CHARS)


def mark(text: Any) -> str:
    """A provisional mark: "RUN@TIME" (TIME a finite number), or "RUN" (written at time 0).

    Example:
        >>> mark("123-1700000000@1700000001.5")
        '123-1700000000@1700000001.5'
        >>> mark("x@notatime")
        Traceback (most recent call last):
        ...
        gemmtune.store.entry.BadEntry: provisional mark 'x@notatime' is not RUN@TIME
    """
    name(text, "provisional mark", MAX_MARK_CHARS)
    run, sep, written = text.partition("@")
    try:
        ok = bool(run) and (not sep or math.isfinite(float(written)))
    except ValueError:
        ok = False
    if not ok:
        raise BadEntry(f"provisional mark {shown(text)} is not RUN@TIME")
    return text


def info(text: Any) -> dict[str, Any]:
    """Env info: a JSON object of at most `MAX_ENTRY_BYTES`."""
    if not isinstance(text, str):
        raise BadEntry(f"env info is {type(text).__name__}, not text")
    if len(text) > MAX_ENTRY_BYTES:
        raise BadEntry(f"env info is {len(text)} characters long (at most {MAX_ENTRY_BYTES})")
    obj = _json(text, "env info")
    if not isinstance(obj, dict):
        raise BadEntry(f"env info is a JSON {type(obj).__name__}, not an object")
    return obj


def member(text: Any) -> tuple[str, str]:
    """A Redis index member: JSON [env, problem] of two keys.

    Example:
        >>> member('["e", "p"]')
        ('e', 'p')
    """
    if not isinstance(text, str) or len(text) > 2 * MAX_KEY_CHARS + 16:
        raise BadEntry("index member is not text of a bounded length")
    obj = _json(text, "index member")
    if not isinstance(obj, list) or len(obj) != 2:
        raise BadEntry(f"index member {shown(text)} is not [env, problem]")
    return name(obj[0], "env key", MAX_KEY_CHARS), name(obj[1], "problem key", MAX_KEY_CHARS)


def storable(r: Row) -> Row:
    """`r` as it is written: a time that is not finite (a timing that failed) is written as no time.

    Example:
        >>> storable(Row("aten_mm", None, "{}", "{}", float("inf"), "ok")).ms is None
        True
    """
    if r.ms is not None and not (math.isfinite(r.ms) and r.ms >= 0):
        return Row(r.template, r.src_hash, r.config, r.runtime, None, r.status, r.stage)
    return r


def replaces(old: Row | None, new: Row) -> bool:
    """Whether a stored row `old` (None: absent, or a bad entry) gives way to `new`: a row already
    there with the same source hash wins, unless it is a `not_benchmarked` row and `new` a timing."""
    return (old is None or old.src_hash != new.src_hash
            or (old.status == "not_benchmarked" and new.status != "not_benchmarked"))


# -- what a signature covers ---------------------------------------------------------------------
def _n(value: str | None) -> str:
    return NONE if value is None else value


def _t(value: float | None) -> str:
    return NONE if value is None else repr(float(value))


def row_parts(env: str, problem: str, r: Row) -> tuple[str, ...]:
    """The signed parts of a timing row: ("row", env, problem) then `row_rest`."""
    return ("row", env, problem, *row_rest(r))


def row_rest(r: Row) -> tuple[str, ...]:
    return (r.template, r.config, r.runtime, _n(r.src_hash), _t(r.ms), r.status, _n(r.stage))


def pick_parts(env: str, problem: str, describe_: str | None, r: Row) -> tuple[str, ...]:
    """The signed parts of a pick (its description included)."""
    return ("pick", env, problem, _n(describe_), r.template, r.config, r.runtime, _n(r.src_hash), _t(r.ms),
            _n(r.stage))


def mark_parts(env: str, problem: str, text: str) -> tuple[str, ...]:
    return ("prov", env, problem, text)


def info_parts(env: str, obj: dict[str, Any]) -> tuple[str, ...]:
    return ("env", env, canon(obj))


class Entries:
    """One store's reader of entries: the schema, then (with a key) the signature.  A bad entry is
    skipped with one warning naming the store and the key, and kept in `bad` (see the module).

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> e = Entries(Store(":memory:")); e.quiet = True
        >>> e.read(lambda: "picks[e, p]", lambda: (pick(1, None, "{}", "{}", 1.0, None), None)) is None, e.bad
        (True, [('picks[e, p]', 'template is int, not text')])
    """

    def __init__(self, store: Any, keep: int | None = MAX_KEPT):
        self.store = store
        self.bad: list[tuple[str, str]] = []
        self.more = 0  # bad entries beyond `keep`
        self.quiet = False  # `gemmtune cache check`: listed, not warned about
        self._keep = keep
        self._seen: set[tuple[str, str]] = set()
        self._warned = 0

    @property
    def signer(self) -> Any:
        trust = getattr(self.store, "trust", None)
        return trust.signer if trust is not None else None

    def sign(self, parts: tuple[str, ...]) -> str | None:
        """The signature of `parts` under the store's key (None without one)."""
        signer = self.signer
        return signer.sign(*parts) if signer is not None else None

    def row_check(self, env: str, problem: str, rows: int) -> Callable[[Any, Any], bool] | None:
        """A verifier of one problem's `rows` rows for `read_signed` (for many, their common parts
        hashed once), or None without a key."""
        signer = self.signer
        if signer is None:
            return None
        if rows < 4:
            return lambda r, sig: signer.verify(sig, "row", env, problem, *row_rest(r))
        verifier = signer.prefixed("row", env, problem)
        return lambda r, sig: verifier.verify(sig, *row_rest(r))

    def skip(self, key: str, why: str) -> None:
        """Count a bad entry and warn about it, once per process."""
        if (key, why) in self._seen:
            return
        if self._keep is not None and len(self.bad) >= self._keep:
            self.more += 1
            return
        self._seen.add((key, why))
        self.bad.append((key, why))
        if self.quiet:
            return
        self._warned += 1
        if self._warned > MAX_WARNINGS:
            return
        tail = ("; further bad entries are not warned about (gemmtune cache check lists them)"
                if self._warned == MAX_WARNINGS else "")
        msg = f"store {self.store.path}: skipped {key}: {why}{tail}"
        log.warning("gemmtune: %s", msg)
        warnings.warn(f"gemmtune: {msg}", RuntimeWarning, stacklevel=5)

    def read(self, key: Callable[[], str], parse: Callable[[], tuple[Any, Any]],
             parts: Callable[[Any], tuple[str, ...]] | None = None,
             check: Callable[[Any, Any], bool] | None = None) -> Any:
        """The entry of `parse()` (which returns it and its signature) when it passes the schema and
        (with a key) its signature signs `parts(entry)`; else None, after `skip`.  `key()` names the
        entry (built only for a bad one)."""
        got = self.read_signed(key, parse, parts, check)
        return None if got is None else got[0]

    def read_signed(self, key: Callable[[], str], parse: Callable[[], tuple[Any, Any]],
                    parts: Callable[[Any], tuple[str, ...]] | None = None,
                    check: Callable[[Any, Any], bool] | None = None) -> tuple[Any, Any] | None:
        """As `read`, with the entry's signature: (entry, signature) or None.  `check(entry, sig)`,
        where given, verifies instead of `parts` (`row_check`: a problem's rows)."""
        try:
            got, sig = parse()
        except BadEntry as exc:
            self.skip(key(), str(exc))
            return None
        signer = self.signer
        if signer is not None and (parts is not None or check is not None) and not (
                check(got, sig) if check is not None else signer.verify(sig, *parts(got))):  # type: ignore[misc]
            self.unverified(key(), sig)
            return None
        return got, sig

    def unverified(self, key: str, sig: Any) -> None:
        """Skip an entry whose signature `sig` (None: none) does not verify under the store's key."""
        self.skip(key, "it is not signed" if sig is None else "its signature does not verify under the store key")
