"""How a tune tells where it is: one line per stage on stderr, off a terminal.

`gemmtune.tune(..., progress=None)` (the default) prints the stage lines of a tune still running after
`QUIET_S` seconds, when stderr is not a terminal and no listener was passed: a cold compile says what
it is doing, while a cache hit or a quick tune prints nothing.  The lines held back until then come
at once.  `progress=True` prints every line; `progress=False` none.  The `gemmtune` command passes
its own listener (a bar on a terminal, these lines off one).
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

__all__ = ["QUIET_S", "StageLines", "Deferred", "silenced", "stage_lines", "write_stderr"]

QUIET_S = 1.0
"""With progress=None, the seconds a tune runs before its stage lines are printed."""
_SILENCED: ContextVar[bool] = ContextVar("gemmtune_stage_lines_silenced", default=False)


@contextmanager
def silenced() -> Iterator[None]:
    """Within it, a tune of progress=None prints no stage lines (`gemmtune.warmup(progress=False)`).

    Example:
        >>> lines = []
        >>> with silenced(), stage_lines(None, write=lines.append, after_s=0) as listen:
        ...     listen("choices", total=3, binaries=2)
        >>> lines
        []
    """
    token = _SILENCED.set(True)
    try:
        yield
    finally:
        _SILENCED.reset(token)


class StageLines:
    """Off a terminal (stderr piped or a file): one line per stage of a tune instead of a bar.

    Example:
        >>> lines = []
        >>> listen = StageLines(lines.append)
        >>> listen("choices", total=26, binaries=8); listen("compile", done=8, total=8)
        >>> listen("benchmark", done=1, total=26); listen("benchmark", done=2, total=26)
        >>> [line.split(" (")[0] for line in lines]
        ['26 choices, 8 binaries: compiling', 'compiled 8 binaries', 'benchmarking 26 choices']
    """

    def __init__(self, write: Any):
        self.write, self.clock, self.started = write, time.perf_counter, time.perf_counter()
        self.seen: set[str] = set()

    def __call__(self, event: str, **info: Any) -> None:
        elapsed = f" ({self.clock() - self.started:.1f} s)"
        if event == "choices":
            self.write(f"{info['total']} choices, {info['binaries']} binaries: compiling{elapsed}")
        elif event == "compile" and info["done"] >= info["total"] and "compile" not in self.seen:
            self.seen.add("compile")
            self.write(f"compiled {info['total']} binaries{elapsed}")
        elif event == "benchmark" and "benchmark" not in self.seen:
            self.seen.add("benchmark")
            self.write(f"benchmarking {info['total']} choices{elapsed}")


def write_stderr(line: str) -> None:
    """Write `gemmtune: LINE` on stderr; a closed or missing stderr is skipped (the tune goes on)."""
    try:
        sys.stderr.write(f"gemmtune: {line}\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


class Deferred:
    """A writer that holds lines back until `after_s` seconds have passed (a timer thread), then writes
    the held lines and every later one; after `close()` it writes nothing.

    Example:
        >>> lines = []
        >>> held = Deferred(lines.append, after_s=3600)
        >>> held("compiling"); held.close(); lines
        []
    """

    def __init__(self, write: Callable[[str], None], after_s: float):
        self._write, self._live, self._done = write, False, False
        self._held: list[str] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(after_s, self._go_live)
        self._timer.daemon = True
        self._timer.start()

    def __call__(self, line: str) -> None:
        with self._lock:
            if self._done:
                return
            if self._live:
                self._write(line)
            else:
                self._held.append(line)

    def _go_live(self) -> None:
        with self._lock:
            if self._done:
                return
            self._live = True
            for line in self._held:
                self._write(line)
            self._held.clear()

    def close(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


def _stderr_is_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


def _ignore(event: str, **info: Any) -> None:
    return None


@contextmanager
def stage_lines(progress: bool | None, listener: Callable[..., None] | None = None,
                write: Callable[[str], None] = write_stderr,
                after_s: float | None = None) -> Iterator[Callable[..., None]]:
    """The listener one tune reports to: `listener` (if any) and, where `progress` asks for them, stage
    lines written by `write`.  True: every line; False: none; None: none where a listener is given, stderr
    is a terminal or within `silenced()`, else those of a tune still running after `after_s` (default
    QUIET_S) seconds.

    Example:
        >>> lines = []
        >>> with stage_lines(True, write=lines.append) as listen:
        ...     listen("choices", total=3, binaries=2)
        >>> with stage_lines(False, write=lines.append) as listen:
        ...     listen("choices", total=3, binaries=2)
        >>> [line.split(" (")[0] for line in lines]
        ['3 choices, 2 binaries: compiling']
    """
    if progress is False or (progress is None and (listener is not None or _SILENCED.get() or _stderr_is_terminal())):
        yield listener or _ignore
        return
    held = Deferred(write, QUIET_S if after_s is None else after_s) if progress is None else None
    lines = StageLines(held or write)

    def both(event: str, **info: Any) -> None:
        if listener is not None:
            listener(event, **info)
        lines(event, **info)

    try:
        yield both
    finally:
        if held is not None:
            held.close()
