"""Store hits whose kernels are built later, all at once: a warm-up from a warm store.

Inside `deferring()`, a tune the store answers (the engine's full hit) does not build its pick's kernel:
its Selection holds a `LaterBuild` launcher, built on its first call or by `build_all`, which builds every
kernel still pending in parallel, a thread per kernel, as a tune's compiles run.  A generated pick whose
compiler cache is cold costs a compile (about a second on a GPU); a warm-up that reads tens of them
builds them together instead of one after another.  `gemmtune.warmup` defers its tunes and builds what
is pending before it checks its picks in the model.

A pick that fails to build runs its problem's library kernel in this process, with a warning (a tune
that met the failure would have searched again; the store keeps its entry).  Inside `standing_in(keys)`,
an unbuilt pick of a problem in `keys` runs its library kernel and stays unbuilt: the warm-up stands in
for the picks its kept in-model verdicts send to torch's op (`dispatch.checking`), so they are never
built; one that runs later is built on its first call.  A store shared between
machines is never deferred: a pick read from it is run and checked as it is read (`store.checked`).

Example:
    >>> with deferring() as pending:
    ...     later = defer(None, lambda: (lambda tensors, out=None: "built"), None, "mm(2x2, 2x2)")
    >>> len(pending), later.built, build_all(pending), later.built, later(())
    (1, False, 1, True, 'built')
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Collection, Iterable, Iterator, Sequence

from ..templates.base import Launcher

__all__ = ["LaterBuild", "deferring", "defer", "for_pick", "build_all", "standing_in", "pick_key", "release"]

log = logging.getLogger("gemmtune")
_PENDING: contextvars.ContextVar[list | None] = contextvars.ContextVar("gemmtune_deferred", default=None)
_STANDING: contextvars.ContextVar[frozenset] = contextvars.ContextVar("gemmtune_standing_in", default=frozenset())


def pick_key(problem_key: str, winner: str) -> str:
    """What names a deferred pick in `standing_in`, `build_all` and `release`: its problem and its winner.

    Example:
        >>> pick_key("mm(2x2, 2x2)/float32/ab12", "numba_mm_t16")
        'mm(2x2, 2x2)/float32/ab12|numba_mm_t16'
    """
    return f"{problem_key}|{winner}"


class LaterBuild:
    """A launcher built on first use: `build()`, or where it raises, `fallback()` (a library kernel's
    launcher, called without the pick's runtime params); with no fallback the error is raised.  `key`:
    the pick's `pick_key`, which `standing_in` names."""

    def __init__(self, build: Callable[[], Launcher], fallback: Callable[[], Launcher] | None, describe: str,
                 key: str | None = None):
        self._build, self._fallback, self._describe, self.key = build, fallback, describe, key
        self._launch: Launcher | None = None
        self._stand: Launcher | None = None  # the fallback's launcher, while it stands in for the pick
        self._fell_back = self._released = self._warned = False
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        return self._launch is not None

    @property
    def released(self) -> bool:
        """Released unbuilt (`release`): the pick was never built; the library kernel runs its problem."""
        return self._released


    def launcher(self) -> Launcher:
        """The built launcher (built now, once, where it is not yet)."""
        with self._lock:
            if self._launch is None:
                try:
                    self._launch = self._build()
                except Exception as exc:  # noqa: BLE001 - the library kernel computes the problem instead
                    if self._fallback is None:
                        raise
                    log.warning("gemmtune: %s: the stored pick failed to build (%s: %s); the library kernel runs "
                                "it in this process", self._describe, type(exc).__name__, str(exc)[:200])
                    self._launch, self._fell_back = self._fallback(), True
                self._build = self._fallback = self._stand = None  # type: ignore[assignment] # their operands go
            return self._launch

    def release(self) -> None:
        """Where unbuilt: drop the build (and the tune's operands it holds); from now on the library kernel
        runs this pick's problem, with a warning on its first call.  For a pick sent to torch's op."""
        with self._lock:
            if self._launch is not None or self._fallback is None:
                return
            self._launch, self._fell_back = self._fallback(), True
            self._build = self._fallback = self._stand = None  # type: ignore[assignment]
            self._released = True

    def stand_in(self) -> Launcher | None:
        """The library kernel's launcher where this pick is unbuilt and its problem is named by the enclosing
        `standing_in` block, else None."""
        if self._launch is not None or self.key is None or self.key not in _STANDING.get():
            return None
        with self._lock:
            if self._launch is not None or self._fallback is None:
                return None
            if self._stand is None:
                self._stand = self._fallback()
            return self._stand

    def __call__(self, tensors: Sequence[Any], out: Any = None, **runtime: Any) -> Any:
        launch = self._launch  # built: no lock
        if self._released and not self._warned:
            self._warned = True
            log.warning("gemmtune: %s: a pick its in-model verdict sent to torch's op runs again; it was never "
                        "built, and the library kernel runs it in this process", self._describe)
        if launch is None:
            stand = self.stand_in()
            if stand is not None:
                return stand(tensors, out)
            launch = self.launcher()
        return launch(tensors, out) if self._fell_back else launch(tensors, out, **runtime)

    def bound(self, tensors: Sequence[Any], **runtime: Any) -> Any:
        """The built launcher bound to `tensors`' problem (`templates.triton.base.bound_launcher`), or None
        (also while the library kernel stands in: the caller keeps the general call)."""
        if self.stand_in() is not None:
            return None
        binder = getattr(self.launcher(), "bound", None)
        if binder is None:
            return None
        return binder(tensors) if self._fell_back else binder(tensors, **runtime)


@contextlib.contextmanager
def standing_in(keys: Iterable[str]) -> Iterator[None]:
    """Within the block, an unbuilt pick of a problem whose key is in `keys` runs its library kernel, unbuilt."""
    token = _STANDING.set(_STANDING.get() | frozenset(keys))
    try:
        yield
    finally:
        _STANDING.reset(token)


@contextlib.contextmanager
def deferring() -> Iterator[list[LaterBuild]]:
    """Within the block, store hits defer their kernels (`defer`); yields the list they join."""
    token = _PENDING.set([])
    try:
        yield _PENDING.get()  # type: ignore[misc]
    finally:
        _PENDING.reset(token)


def defer(store: Any, build: Callable[[], Launcher], fallback: Callable[[], Launcher] | None,
          describe: str, key: str | None = None) -> LaterBuild | None:
    """A `LaterBuild` of `build`, joined to the enclosing `deferring()` block; None outside one, or where
    `store` is shared between machines (its picks are checked as they are read)."""
    pending = _PENDING.get()
    if pending is None or getattr(store, "shared", False):
        return None
    later = LaterBuild(build, fallback, describe, key)
    pending.append(later)
    return later


def for_pick(store: Any, winner: Any, choices: Sequence[Any], launcher: Callable[[Any], Launcher],
             ki: Any) -> LaterBuild | None:
    """`defer` of a store hit's generated pick `winner` for the problem `ki` (`launcher(choice)` builds a
    choice's launcher), the library kernel among `choices` its fallback; None for a library pick, or where
    no library kernel competed."""
    library = next((c for c in choices if c.is_extern), None)
    if winner.is_extern or library is None:
        return None
    return defer(store, lambda: launcher(winner), lambda: launcher(library), ki.describe(),
                 pick_key(ki.problem_key, winner.name))


def build_all(pending: Sequence[LaterBuild], workers: int = 0, skip: Collection[str] = (),
              only: Collection[str] | None = None) -> int:
    """Build every launcher of `pending` not yet built, in parallel, but those whose key is in `skip` (and,
    given `only`, those whose key is not in it); how many were built now."""
    todo = [d for d in pending if not d.built and d.key not in skip and (only is None or d.key in only)]
    if todo:
        with ThreadPoolExecutor(max_workers=min(len(todo), workers or os.cpu_count() or 1),
                                thread_name_prefix="gemmtune-deferred") as pool:
            list(pool.map(LaterBuild.launcher, todo))
    return len(todo)


def release(pending: Sequence[LaterBuild], keys: Collection[str]) -> int:
    """`LaterBuild.release` each unbuilt launcher of `pending` whose key is in `keys`; how many."""
    todo = [d for d in pending if not d.built and d.key in keys]
    for later in todo:
        later.release()
    return len(todo)
