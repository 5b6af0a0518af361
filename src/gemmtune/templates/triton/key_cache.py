"""Triton's key for its own installation, kept across processes (`Settings.triton_key_cache`).

Triton keys every kernel it compiles or loads by a hash of its own installation,
`triton.runtime.cache.triton_key()`: the sha256 of its compiler's Python files and of its native
library, `libtriton.so` (about 480 MB).  It is computed once per process, when the process first
compiles or loads a Triton kernel, and that takes 0.43-0.56 s on a CI-class CPU
(measured on the CPU machine).  A warm-up pays it even when every kernel comes from a cache,
and so do the isolation worker and each compile worker of a tune.  The kept key serves the later
processes of one machine; the signature below is of this machine's files, so it is not shared.

`install()` keeps the key in gemmtune's cache directory (`triton_key.json`) under a signature of
what the key hashes, which takes a few milliseconds to read: Triton's version, Python's extension
suffix, and the relative path, size, inode and modification and change times (in ns) of every file
under Triton's `compiler/`, `backends/`, `language/` and `_C/` directories and of `runtime/cache.py`
(a superset of the files Triton hashes).  A file changed, added or removed changes the signature, and
Triton computes the key again.  Triton is given the kept key by replacing the module attribute its
`get_cache_key` calls, as Triton's own compile-preload worker does (`triton.runtime.cache.triton_key`);
every module that imported the function by name (Triton's `runtime.autotuner`, Inductor's
`runtime.triton_compat` where it is loaded) is given the same.  A key Triton computed in this
process before is served as it is and not written, and a key whose files changed while Triton hashed
them is not written either.  A Triton without that function (another layout) is left as it is.

A key this machine has not kept yet is asked of the shared store first, where kernels are shared
(`wheel_key`: the same Triton wheel on another machine computed the same key), and Triton hashes
itself only where the store has none.

Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> path = os.path.join(d, "triton_key.json")
    >>> remembered("sig", lambda: "KEY", path), remembered("sig", lambda: "OTHER", path)
    ('KEY', 'KEY')
    >>> remembered("new", lambda: "OTHER", path)
    'OTHER'
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from . import wheel_key

__all__ = ["ensure", "install", "signature", "remembered", "installed"]

log = logging.getLogger("gemmtune")
FILE = "triton_key.json"
KEEP = 8  # signatures kept (one per Triton installation that shares the cache directory)
_LOCK = threading.Lock()
_INSTALLED: list[Callable[[], str]] = []
_ASKED: list[bool] = []  # `ensure` has read the setting in this process


def signature(root: str | Path, version: str) -> str:
    """A digest of what Triton's key hashes, read from the files' metadata only (see the module docstring).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> signature(d, "3.6.0") == signature(d, "3.6.0") != signature(d, "3.6.1")
        True
    """
    root = Path(root)
    h = hashlib.sha256(f"{version}|{sysconfig.get_config_var('EXT_SUFFIX')}|{sys.version}".encode())
    paths = wheel_key.signed_paths(root)
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            h.update(f"{p.relative_to(root)}|missing\n".encode())
            continue
        h.update(f"{p.relative_to(root)}|{st.st_size}|{st.st_ino}|{st.st_mtime_ns}|{st.st_ctime_ns}\n".encode())
    return h.hexdigest()


def remembered(sig: str, compute: Callable[[], str], path: str | Path,
               again: Callable[[], str] | None = None) -> str:
    """The key kept at `path` under `sig`, else `compute()`, kept there for the next process unless
    `again()` (the signature read once more) differs from `sig`: files that changed while Triton
    hashed them are not vouched for.  A file that cannot be read or written is a miss, never an error."""
    kept = _read(Path(path))
    if isinstance(kept.get(sig), str):
        return kept[sig]
    key = compute()
    if again is not None and again() != sig:
        return key
    kept.pop(sig, None)
    kept[sig] = key
    _write(Path(path), dict(list(kept.items())[-KEEP:]))
    return key


def ensure() -> None:
    """`install()` where `Settings.triton_key_cache` is on (the default), asked once per process;
    called before gemmtune compiles or loads a Triton kernel.

    Example:
        >>> from gemmtune.templates.triton import key_cache
        >>> key_cache.ensure()  # doctest: +SKIP
    """
    if _ASKED:
        return
    from ...core.settings import Settings

    _ASKED.append(True)
    if Settings.from_env().triton_key_cache:
        install()


def install(cache_dir: str | Path | None = None) -> bool:
    """Give this process's Triton the kept key (once per process; later calls return at once).
    Returns whether Triton's key function is gemmtune's now.  `cache_dir`: where `triton_key.json`
    lives (default: gemmtune's cache directory).

    Example:
        >>> from gemmtune.templates.triton import key_cache
        >>> key_cache.install()  # doctest: +SKIP
        True
    """
    with _LOCK:
        if _INSTALLED:
            return True
        try:
            import triton
            import triton.runtime.cache as cache
        except Exception:  # noqa: BLE001 - no (importable) Triton: nothing to give a key to
            return False
        original = getattr(cache, "triton_key", None)
        if not callable(original):
            log.info("gemmtune: this Triton has no runtime.cache.triton_key; its key is computed per process")
            return False
        if cache_dir is None:
            from ...core.environment import cache_dir as default_dir

            cache_dir = default_dir()
        root, path = Path(triton.__file__).parent, Path(cache_dir) / FILE

        def sign() -> str:
            return signature(root, triton.__version__)

        def key() -> str:
            info = getattr(original, "cache_info", None)
            if info is not None and info().currsize:
                # Triton hashed itself in this process already (before gemmtune's first compile): that
                # key is this process's, and it is not written (the files may have changed since).
                return original()
            return remembered(sign(), lambda: wheel_key.shared_key(root, triton.__version__, original), path,
                              again=sign)

        kept = functools.lru_cache(maxsize=None)(key)
        _replace(original, kept)
        _INSTALLED.append(kept)
        return True


def installed() -> bool:
    """Whether `install` has given this process's Triton the kept key."""
    return bool(_INSTALLED)


def _replace(original: Callable[[], str], kept: Callable[[], str]) -> None:
    """Every loaded module that holds Triton's own key function under its name gets `kept` in its place
    (Triton's `runtime.cache` and `runtime.autotuner`, Inductor's `runtime.triton_compat` where loaded).
    A module's own namespace is read, never its `__getattr__`."""
    for module in list(sys.modules.values()):
        space = getattr(module, "__dict__", None)
        if isinstance(space, dict) and space.get("triton_key") is original:
            setattr(module, "triton_key", kept)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict[str, str]) -> None:
    """Replace `path` atomically (a racing process reads the old file or the new one, never half)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".triton_key.")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("gemmtune: Triton's key not kept (%s)", exc)
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)
