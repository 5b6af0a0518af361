"""Rendered `numba_mm` kernel files: written to the cache directory, imported once per process, and
forgotten (with Numba's cache files of them) when those cache files are damaged.

Numba stores the machine code of a ``cache=True`` function next to its ``.py`` file, in
``__pycache__/<stem>.<function>-<line>.py<ver>.nbi`` (an index) and ``.nbc`` (the code), and reads
them back without checking them: a file cut short by a full disk or a killed process raises
``UnpicklingError`` or ``EOFError`` in every later process.  `forget` removes a kernel's files and
its module, so that importing it again makes Numba compile it and write new ones.

Numba unpickles its index files, so the kernels live only in a directory no one else can write: the
cache directory, or where that is not writable, ``$TMPDIR/gemmtune-<uid>/numba`` when both are
directories of this user's with mode 0700 (not links; `private`), else a fresh private directory
(`tempfile.mkdtemp`), said in one line.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> mod = load_module("demo_stem", lambda: "X = 1\\n", root)
    >>> mod.X, load_module("demo_stem", lambda: "X = 2\\n", root) is mod
    (1, True)
    >>> forget(mod, ValueError("demo")); load_module("demo_stem", lambda: "X = 2\\n", root).X
    2
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import stat
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Callable

log = logging.getLogger("gemmtune")
_MODULES: dict[str, ModuleType] = {}
_LOAD_LOCK = threading.RLock()
_FRESH: list[Path] = []  # the private directory made in this process, where the shared one was refused


def _after_fork_in_child() -> None:
    global _LOAD_LOCK
    _LOAD_LOCK = threading.RLock()  # a thread of the parent may have held it: a fork child starts free


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _fallback_dir() -> Path:
    """Where kernels go when the cache directory is not writable: `$TMPDIR/gemmtune-<uid>/numba` where it
    is private to this user, else a fresh private directory (one per process)."""
    user = os.getuid() if hasattr(os, "getuid") else os.getpid()
    shared = Path(tempfile.gettempdir()) / f"gemmtune-{user}"
    why = private(shared) or private(shared / "numba")
    if why is None:
        return shared / "numba"
    if not _FRESH:
        _FRESH.append(Path(tempfile.mkdtemp(prefix=f"gemmtune-{user}-numba-")))
        log.warning("gemmtune: numba_mm: not using %s (%s); kernels go to the new private directory %s",
                    shared / "numba", why, _FRESH[0])
    return _FRESH[0]


def private(path: Path) -> str | None:
    """None where `path` is a directory of this user's with mode 0700 (made so if missing; one of this
    user's that no one else may write, as an older gemmtune made it, is set to 0700), else why not.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> private(root / "mine"), (root / "mine").stat().st_mode & 0o777 == 0o700
        (None, True)
    """
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"it cannot be made: {exc}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"it cannot be read: {exc}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory but a {'link' if stat.S_ISLNK(st.st_mode) else 'file'}"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 == 0 and mode != 0o700:  # only this user could have written in it: made private
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)  # not a link: checked above
            mode = stat.S_IMODE(os.lstat(path).st_mode)
    return None if mode == 0o700 else f"{path} has mode {mode:04o}, not 0700"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` unless it already holds it (tmp file + os.replace).

    An unchanged file keeps its mtime, which Numba's on-disk cache is keyed on.
    """
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_module(stem: str, render: Callable[[], str], root: Path) -> ModuleType:
    """The module `<root>/<stem>.py` holding `render()`, written and imported once per process (a root
    that is not writable falls back to a per-user temporary directory)."""
    with _LOAD_LOCK:
        mod = _MODULES.get(stem)
        if mod is not None:
            return mod
        text = render()
        path = root / f"{stem}.py"
        try:
            write_atomic(path, text)
        except OSError:  # cache directory not writable: fall back to a per-user temporary one
            path = _fallback_dir() / path.name
            write_atomic(path, text)
        name = f"gemmtune_numba_kernel_{stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None  # a .py file always has a source loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _MODULES[stem] = mod
        return mod


def forget(mod: ModuleType, exc: BaseException) -> None:
    """Remove `mod` (its first run failed with `exc`) and Numba's cache files of it: the next
    `load_module` imports it again and Numba compiles it afresh.  A failure that was not the cache's
    raises again on that retry."""
    path = Path(mod.__file__ or "")
    log.info("gemmtune: numba_mm: the cached kernel %s did not load (%s: %s); compiling it again",
             path.stem, type(exc).__name__, exc)
    with _LOAD_LOCK:
        for stale in (path.parent / "__pycache__").glob(f"{path.stem}.*"):
            with contextlib.suppress(OSError):
                stale.unlink()
        for stem, loaded in list(_MODULES.items()):
            if loaded is mod:
                del _MODULES[stem]
        sys.modules.pop(mod.__name__, None)
