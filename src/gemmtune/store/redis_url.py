"""A Redis store's URL: what it may say, what is printed of it (never a password), and the client.

`redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?OPTION=VALUE&...]`, or `rediss://...` for TLS.  DB is a
non-negative integer (default 0).  The query parameters read (`ACCEPTED`), anything else refused in one line:

- `prefix=NAME` (default `gemmtune`) and `timeout=SECONDS` (default 0.25, at most 60): gemmtune's own;
- `username=USER`, `password=PASSWORD`: the credentials, as in the user part (a password also comes
  from `GEMMTUNE_REDIS_PASSWORD`);
- `ssl_cert_reqs=none|optional|required`, `ssl_ca_certs=FILE`, `ssl_certfile=FILE`,
  `ssl_keyfile=FILE`: TLS, with `rediss://` only.

A URL is printed only through `redact`: a password, in the user part or in the query, and the value
of any parameter not in `PRINTABLE` become `***`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlencode, urlsplit, urlunsplit

from ..core.errors import SettingsError

__all__ = ["ACCEPTED", "PASSWORD_ENV", "SCHEMES", "connect", "is_redis_url", "parse", "redact"]

SCHEMES = ("redis", "rediss")
PASSWORD_ENV = "GEMMTUNE_REDIS_PASSWORD"
OWN = ("prefix", "timeout")
TLS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
ACCEPTED = OWN + ("username", "password") + TLS
PRINTABLE = OWN + ("username",) + TLS  # every other value is printed as ***
CERT_REQS = ("none", "optional", "required")
PREFIX_REFUSED = " :*?[]\\"  # a prefix is a name: no key separator, no glob character


def is_redis_url(location: str | None) -> bool:
    """Whether a store location names a Redis server.

    Example:
        >>> is_redis_url("redis://localhost:6379/0"), is_redis_url("REDISS://h/1"), is_redis_url("x.sqlite")
        (True, True, False)
    """
    return isinstance(location, str) and location.split("://", 1)[0].lower() in SCHEMES and "://" in location


def redact(url: str) -> str:
    """The URL as it may be printed: no password, in the user part or the query, and no value of an
    parameter that is not in `PRINTABLE` (a misplaced `?` or `#` in a password leaves parts of it there).

    Example:
        >>> redact("redis://:s3cret@db:6379/2?prefix=team"), redact("redis://user:pw@db/0?password=pw&foo=1")
        ('redis://:***@db:6379/2?prefix=team', 'redis://user:***@db/0?password=***&foo=***')
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:
        return f"{url.split('://', 1)[0]}://***"
    user, at, host = netloc.rpartition("@")
    if at and ":" in user:
        user = f"{user.split(':', 1)[0]}:***"
    name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if colon and not port.isdigit():
        host = f"{name}:***"  # the netloc ended inside a password (an unescaped '/', '?' or '#')
    path = parts.path if re.fullmatch(r"/?[0-9]*", parts.path) else "/***"
    query = "&".join(_shown(piece) for piece in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, f"{user}{at}{host}", path, query, "***" if parts.fragment else ""))


def _shown(piece: str) -> str:
    name, eq, value = piece.partition("=")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", unquote_plus(name)):
        return "***"
    return piece if unquote_plus(name) in PRINTABLE or not (eq or value) else f"{name}=***"


def parse(url: str) -> tuple[str, str, float]:
    """(the URL for the client, key prefix, timeout in seconds); gemmtune's own parameters removed.
    A SettingsError, naming the redacted URL and what is wrong, for a URL the store cannot use.

    Example:
        >>> parse("redis://db:6379/3?prefix=fleet-a&timeout=0.5")
        ('redis://db:6379/3', 'fleet-a', 0.5)
        >>> parse("redis://db/0?foo=1")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.SettingsError: store: redis://db/0?foo=***: unknown parameter 'foo' (a redis store reads prefix, timeout, username, password, ssl_cert_reqs, ssl_ca_certs, ssl_certfile, ssl_keyfile)
    """
    where = f"store: {redact(url)}"
    parts = _split(url, where)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = dict(pairs)
    _check_options(pairs, parts.scheme.lower(), where)
    prefix = query.pop("prefix", "gemmtune")
    raw = query.pop("timeout", "0.25")
    try:
        timeout = float(raw)
    except ValueError:
        timeout = math.nan
    if not (0 < timeout <= 60):
        raise SettingsError(f"{where}: timeout must be a number of seconds in (0, 60], got {raw!r}")
    if not prefix or not prefix.isprintable() or any(c in prefix for c in PREFIX_REFUSED):
        raise SettingsError(f"{where}: prefix must be a non-empty name without spaces, control characters, "
                            f"':', '\\' or glob characters (*?[]), got {prefix!r}")
    return urlunsplit(parts._replace(query=urlencode(query))), prefix, timeout


def _split(url: str, where: str) -> Any:
    """The URL's parts, its host, port and database checked (messages quote no part of the URL)."""
    try:
        parts = urlsplit(url)
        if parts.port == 0:
            raise ValueError("port 0")
    except ValueError:
        raise SettingsError(f"{where}: the port must be an integer from 1 to 65535 (percent-encode '/', '?' and '#' in a "
                            "password: %2F, %3F, %23)") from None
    if not parts.hostname:
        raise SettingsError(f"{where}: the URL names no host (redis://HOST:PORT/DB)")
    if parts.fragment:
        raise SettingsError(f"{where}: a '#' must be percent-encoded (%23)")
    if not re.fullmatch(r"/?[0-9]*", parts.path):
        raise SettingsError(f"{where}: the database must be an integer (redis://HOST:PORT/DB), e.g. /0")
    return parts


def _check_options(pairs: list[tuple[str, str]], scheme: str, where: str) -> None:
    names = [name for name, _ in pairs]
    for name, value in pairs:
        if name not in ACCEPTED:
            shown = repr(name) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else "that is not a name"
            raise SettingsError(f"{where}: unknown parameter {shown} (a redis store reads {', '.join(ACCEPTED)})")
        if names.count(name) > 1:
            raise SettingsError(f"{where}: parameter {name!r} is given twice")
        if name in TLS and scheme != "rediss":
            raise SettingsError(f"{where}: parameter {name!r} is read with rediss:// (TLS) only")
        if name == "ssl_cert_reqs" and value not in CERT_REQS:
            raise SettingsError(f"{where}: ssl_cert_reqs must be one of {', '.join(CERT_REQS)}, got {value!r}")


def connect(url: str, timeout: float) -> Any:
    """A client for `url` (as `parse` gave it) whose every call times out after `timeout` seconds; the
    password of `GEMMTUNE_REDIS_PASSWORD` where the URL gives none.

    Example:
        >>> connect("redis://127.0.0.1:1/0", 0.05).connection_pool.connection_kwargs["db"]  # doctest: +SKIP
        0
    """
    try:
        import redis
    except ImportError:
        raise SettingsError("store: a redis:// store needs the redis client: pip install 'gemmtune[redis]'") from None
    given = urlsplit(url).password or dict(parse_qsl(urlsplit(url).query)).get("password")
    password = None if given else os.environ.get(PASSWORD_ENV) or None
    try:
        return redis.Redis.from_url(url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout,
                                    decode_responses=True)
    except ValueError as exc:  # redis-py's own checks: they quote no value
        raise SettingsError(f"store: {redact(url)}: {exc}") from None
