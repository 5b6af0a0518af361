"""A Redis store's faults: the server, or this process's memory while the server cannot be used.

`fault` sorts what a call raised into one of three kinds, and names its cause in words:

- DOWN: no answer (a refused connection, a timeout).  Picks made meanwhile are kept in this process's
  memory and their saves queued; the server is tried again at most once every `RETRY_S`, and when it
  answers, the queued saves are written first, in order.
- SERVER: the server answered, and refuses every call for now: a wrong or missing password, no
  permission, out of memory (`maxmemory`), a read-only replica, loading its data, busy with a script,
  a database it does not have.  Handled as DOWN (the condition may end); the warning names the cause.
- CALL: the server refused this one call (its save script failed on a value, a key holds another
  type).  A save it refused is dropped with one warning naming the key and the cause (the pick stays
  in this process), and the queue goes on: one save the server cannot take never holds up the others.

Saves still queued when the process ends are tried once more (`flush`, registered with `atexit` for
each store with a queue); those the server does not take are reported lost, in one warning.  The
`gemmtune cache` commands run `strictly`: a fault raises `StoreUnavailableError` there instead.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import warnings
from typing import Any, Callable, Iterator

from ..core.errors import StoreUnavailableError

__all__ = ["CALL", "DOWN", "SERVER", "ServerOrMemory", "fault"]

log = logging.getLogger("gemmtune")

DOWN, SERVER, CALL = "down", "server", "call"
RETRY_S = 1.0

# (error class name or start of the server's message, what it means): the server refuses every call.
_SERVER_CAUSES = (
    (("AuthenticationError", "NOAUTH", "WRONGPASS"), "the server refused the password"),
    (("AuthorizationError", "NoPermissionError", "NOPERM"), "the server refused this user the commands the store needs"),
    (("OutOfMemoryError", "OOM"), "the server is out of memory (maxmemory)"),
    (("ReadOnlyError", "READONLY"), "the server is a read-only replica"),
    (("BusyLoadingError", "LOADING"), "the server is loading its data"),
    (("BUSY",), "the server is busy running a script"),
    (("MISCONF",), "the server refuses writes (it cannot save its data to disk)"),
    (("MaxClientsReachedError",), "the server has too many clients"),
    (("DB index is out of range", "Invalid Database"), "the server has no such database"),
)


def fault(exc: BaseException) -> tuple[str, str]:
    """(DOWN, SERVER or CALL, the cause in words) of an error a Redis call raised.

    Example:
        >>> import redis
        >>> fault(redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."))[0]
        'down'
        >>> fault(redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."))[1]
        "the server is out of memory (maxmemory) (OutOfMemoryError: command not allowed when used memory > 'maxmemory'.)"
        >>> fault(redis.ResponseError("user_script:1: Expected value but found invalid unicode escape code"))[:2]
        ('call', 'the server refused the save script: user_script:1: Expected value but found invalid unicode escape code')
    """
    import redis

    name, text = type(exc).__name__, " ".join(str(exc).split())
    detail = f"{name}: {text}" if text else name
    for marks, words in _SERVER_CAUSES:
        if any(m == name or text.startswith(m) or (" " in m and m in text) for m in marks):
            return SERVER, f"{words} ({detail})"
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) or not isinstance(
            exc, (redis.ResponseError, redis.DataError)):
        return DOWN, detail
    if "script" in text.lower():
        return CALL, f"the server refused the save script: {text}"
    return CALL, f"the server refused the call ({detail})"


def sentence(path: str, kind: str, cause: str) -> str:
    """What happened to the store at `path`, for a warning or an error.

    Example:
        >>> sentence("redis://h/0", DOWN, "TimeoutError: Timeout reading from socket")
        'redis store redis://h/0 did not answer (TimeoutError: Timeout reading from socket)'
    """
    if kind == DOWN:
        return f"redis store {path} did not answer ({cause})"
    return f"redis store {path} {'cannot be used' if kind == SERVER else 'refused a call'}: {cause}"


class ServerOrMemory:
    """The Redis store's calls: on the server, or in memory while it cannot be used (see the module).

    The store defines `path`, `timeout`, `warnings`, `_memory`, `_key` and `_remote_save`, and calls
    `_init_faults` first.
    """

    path: str
    timeout: float
    warnings: list[str]
    _memory: Any
    _key: Callable[..., str]
    _remote_save: Callable[..., Any]

    def _init_faults(self) -> None:
        self._pending: list[tuple] = []  # saves made while the server could not be used, in order
        self._down_until: float | None = None
        self._replaying = threading.Lock()  # compile threads read kernels too: one replay of the queue
        self._strict = False
        self._exit_hook = False

    @property
    def reachable(self) -> bool:
        """False while this process keeps picks in memory because the server did not answer."""
        return self._down_until is None

    @contextlib.contextmanager
    def strictly(self) -> Iterator[Any]:
        """Within it, a call the server does not answer or refuses raises `StoreUnavailableError`
        instead of falling back to memory (the `gemmtune cache` commands: an effect must be real)."""
        was, self._strict = self._strict, True
        try:
            yield self
        finally:
            self._strict = was

    def _server(self, remote: Callable[[], Any], local: Callable[[], Any],
                refused: Callable[[str], Any] | None = None) -> Any:
        """`remote()` once the queued saves are written; `local()` while the server cannot be used;
        `refused(cause)` for a call the server refused on its own (a save its script cannot take)."""
        import redis

        if not self._strict and self._down_until is not None and time.monotonic() < self._down_until:
            return local()
        try:
            self._replay()
            out = remote()
        except redis.RedisError as exc:
            kind, cause = fault(exc)
            if self._strict:
                raise StoreUnavailableError(sentence(self.path, kind, cause)) from None
            if kind == CALL:  # this call only: the server is not down
                if refused is not None:
                    return refused(cause)
                self._warn(f"{sentence(self.path, kind, cause)}; answered from this process's memory")
                return local()
            self._went_down(kind, cause)
            return local()
        if self._down_until is not None:
            log.warning("gemmtune: redis store %s answers again", self.path)
        self._down_until = None
        return out

    def _replay(self, wait: float = -1) -> None:
        """Write the queued saves, in order; a save the server refuses on its own is dropped."""
        import redis

        if not self._pending:
            return
        if not self._replaying.acquire(timeout=wait):
            raise redis.TimeoutError("another thread is writing the queued saves")
        try:
            while self._pending:
                args = self._pending[0]
                try:
                    self._remote_save(*args)
                except redis.RedisError as exc:
                    kind, cause = fault(exc)
                    if kind != CALL:
                        raise
                    self._refused(args, cause)
                except (ValueError, TypeError) as exc:  # a value that cannot be sent: never sent later either
                    self._refused(args, f"a value cannot be sent ({type(exc).__name__}: {exc})")
                self._pending.pop(0)
        finally:
            self._replaying.release()

    def _queue(self, args: tuple) -> None:
        """Keep a save for the server (written when it answers, or at exit: `flush`)."""
        self._pending.append(args)
        if not self._exit_hook:
            self._exit_hook = True
            atexit.register(self.flush)

    def _refused(self, args: tuple, cause: str) -> None:
        env, problem, describe = args[0], args[2], args[3]
        self._warn(f"redis store {self.path} did not take the pick of {describe} ({self._key('pick', env, problem)}): "
                   f"{cause}; it is kept in this process only")

    def _went_down(self, kind: str, cause: str) -> None:
        if self._down_until is None:
            self._warn(f"{sentence(self.path, kind, cause)}; keeping picks in this process until it answers "
                       "(they are written to it then)")
        self._down_until = time.monotonic() + RETRY_S

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        warnings.warn(f"gemmtune: {message}", RuntimeWarning, stacklevel=6)

    def flush(self) -> int:
        """Try once to write the queued saves (each call bounded by the store's timeout), whether or not
        the server was due for another try; warn in one line about those it did not take, lost when the
        process ends.  Returns how many are still queued (run at exit for a store with a queue)."""
        import redis

        if not self._pending:
            return 0
        try:
            self._replay(wait=self.timeout)
            self._down_until = None
        except redis.RedisError as exc:
            kind, cause = fault(exc)
            why = "did not answer" if kind == DOWN else "could not be used"
            try:
                self._warn(f"{len(self._pending)} picks made while the redis store {self.path} {why} were not "
                           f"written: lost ({cause})")
            except Warning:  # warnings turned into errors (python -W error): at exit, nothing can catch it
                pass
        return len(self._pending)
