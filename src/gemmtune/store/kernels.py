"""Compiled kernels in the store (`Settings.share_kernels`), so a machine that shares the store loads a
pick instead of compiling it.

Triton keeps what it compiles in an on-disk cache, one directory per key, and asks a cache manager
class for it (`triton.knobs.cache.manager_class`, its plug-in point).  `StoreCacheManager` is Triton's
own `FileCacheManager` with the store behind it:

- a file or kernel found on disk is served from disk, as Triton does;
- one not found there is looked up in the store (`Store.kernel_files(key)`), written to the local
  cache and served: Triton then loads it, compiling nothing;
- what Triton builds goes to the local cache only, so the candidates a tune compiles stay out of the
  store.  The pick's kernels are kept by `publish`, after a tune or a store hit
  (`engine._Context.selection`), and the native modules Triton builds with a C compiler (its driver
  stub and the kernels' launchers: a handful per machine, about 0.6 s of gcc on a new one) as they
  are built or first found on disk;
- Triton's key of its own installation is kept under its wheel's signature
  (`templates.triton.wheel_key`), so a new machine with the same Triton reads it instead of hashing
  `libtriton.so` (0.4 s).

Triton's key covers the kernel's source, its compile options, the GPU target and Triton's own version,
so a kernel is only ever served to the same Triton on the same GPU architecture.  A native module's
key covers its C source and the platform, and its name the Python ABI.  A kept kernel is served only
whole (every file of its group kept, under a plain name, its metadata readable); anything else, and a
store that fails to answer, is a cache miss, and Triton compiles.  Each kernel is written to the store
once: a process that finds it there already (`has_kernel_files`) does not send it again.  The store then holds host and GPU code that
a process loads: share a store with kernels only among machines you trust as you trust their Triton
cache.

Example:
    >>> from gemmtune.store.sqlite import Store
    >>> store = Store(":memory:")
    >>> publish(store, [])                      # nothing to keep
    0
    >>> store.put_kernel_files("K", {"k.cubin": b"..."}); store.kernel_files("K")
    {'k.cubin': b'...'}
"""

from __future__ import annotations

import json
import logging
import sysconfig
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

from ..templates.triton import wheel_key

log = logging.getLogger("gemmtune")

GROUP = "__grp__"  # Triton's prefix for a kernel's group file; the store keeps its members' names there
_NATIVE = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
_STATE: dict[str, Any] = {"store": None, "published": set(), "native": {}, "keys": {}}
KEY_PREFIX = "triton_key:"  # Triton's key of its installation, under its wheel's signature (`wheel_key`)
_LOCK = threading.Lock()

try:
    from triton.runtime.cache import FileCacheManager as _Base
except ImportError:  # no Triton: nothing to share
    _Base = object  # type: ignore[assignment,misc]


class StoreCacheManager(_Base):  # type: ignore[misc,valid-type]
    """Triton's file cache, with the shared store answering what the local cache lacks (see the module).
    Triton's override and dump caches (`TRITON_KERNEL_OVERRIDE`, `TRITON_KERNEL_DUMP`) stay local."""

    def __init__(self, key: str, override: bool = False, dump: bool = False):
        super().__init__(key, override, dump)
        self.shared = not (override or dump)

    def get_file(self, filename: str) -> str | None:
        path = super().get_file(filename)
        if path is not None:
            if filename.endswith(_NATIVE) and self.shared:
                _keep_native(self.key, filename, path)
            return path
        if not self.shared:
            return None
        try:
            data = _fetch(self.key).get(filename)
            if data is None or not _plain(filename):
                return None
            path = super().put(data, filename, binary=True)
        except Exception as exc:  # noqa: BLE001 - a cache miss: Triton builds it
            log.info("gemmtune: %s of kernel %s not served from the store: %s", filename, self.key, exc)
            return None
        _served(self.key)
        return path

    def get_group(self, filename: str) -> dict[str, str] | None:
        group = super().get_group(filename)
        if group is not None or not self.shared:
            return group
        try:
            return self._served_group(filename)
        except Exception as exc:  # noqa: BLE001 - a cache miss: Triton compiles the kernel
            log.info("gemmtune: kernel %s not served from the store: %s", filename, exc)
            return None

    def _served_group(self, filename: str) -> dict[str, str] | None:
        files = _fetch(self.key)
        names = _group_names(files, filename)
        if names is None:
            return None
        paths = {name: super(StoreCacheManager, self).put(files[name], name, binary=True) for name in names}
        super().put_group(filename, paths)
        _served(self.key)
        log.info("gemmtune: kernel %s loaded from the store (%d files)", filename, len(paths))
        return paths

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path = super().put(data, filename, binary=binary)
        if filename.endswith(_NATIVE):
            _keep_native(self.key, filename, path)
        return path


def _plain(name: str) -> bool:
    """A bare file name: a store's entry never writes outside the kernel's cache directory (nor a name
    no file system takes: a NUL, more than 255 bytes)."""
    return (bool(name) and name not in (".", "..") and Path(name).name == name and "\\" not in name
            and "\0" not in name and len(name.encode("utf-8", "surrogatepass")) <= 255)


def _group_names(files: dict[str, bytes], filename: str) -> list[str] | None:
    """The members of a kept kernel's group, where the entry is whole: every member a plain name that is
    kept too, and its metadata files (`.json`) JSON objects; else None (Triton compiles it: an entry
    written into the local cache whole but unreadable would fail every load, and never be rebuilt)."""
    try:
        names = json.loads(files.get(GROUP + filename, b"[]"))
    except ValueError:
        return None
    if not isinstance(names, list) or not names or not all(
            isinstance(n, str) and _plain(n) and n in files for n in names):
        return None  # nothing kept, a file missing, or a name that is not a file of this directory
    return names if all(_json_object(files[n]) for n in names if n.endswith(".json")) else None


def _json_object(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), dict)
    except ValueError:
        return False


def share(store: Any) -> bool:
    """Serve Triton's cache misses from `store`, and keep native modules there, in this process (later
    calls switch to their store).  False where it cannot: no Triton, or another cache manager set.

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> share(Store(":memory:")) in (True, False); stop_sharing()
        True
    """
    if _Base is object or not hasattr(store, "kernel_files"):
        return False
    from triton import knobs

    current = knobs.cache.manager_class
    if current is not None and current is not StoreCacheManager:
        if current not in _STATE.setdefault("refused", set()):  # said once per process and manager
            _STATE["refused"].add(current)
            log.warning("gemmtune: share_kernels: Triton already uses cache manager %s; kernels are not shared",
                        getattr(current, "__name__", current))
        return False
    knobs.cache.manager_class = StoreCacheManager
    with _LOCK:
        if _STATE["store"] is not store:
            _STATE.update(store=store, published=set(), native={}, keys={})
    wheel_key.share_with(lambda sig: _triton_key(store, sig), _keep_key)
    return True


def stop_sharing() -> None:
    """Triton's own cache manager again (its knob back to what the environment says), and no store
    behind it."""
    if _Base is not object:
        from triton import knobs

        if knobs.cache.manager_class is StoreCacheManager:
            del knobs.cache.manager_class
    wheel_key.unshare()
    with _LOCK:
        _STATE.update(store=None, published=set(), native={}, keys={})


def sharing(store: Any) -> None:
    """What a tune asks for: share `store`'s kernels (`share`), or none (None: `stop_sharing`, where this
    process shared a store before).

    Example:
        >>> sharing(None)
    """
    if store is not None:
        share(store)
    elif _STATE["store"] is not None:
        stop_sharing()


def publish(store: Any, binaries: Iterable[Any]) -> int:
    """Keep each binary's files in `store` (`templates.binaries.BinaryFiles`: a key and name -> path),
    with a group entry naming them, and the native modules met since the last call; returns how many
    binaries were written (never raises).  Each is written once per process; a file that cannot be
    read is skipped with its binary."""
    put = getattr(store, "put_kernel_files", None)
    if put is not None and store is _STATE["store"]:
        _publish_pending(store)
    written = 0
    for binary in binaries:
        if put is None or not binary.files:
            continue
        try:
            if not _to_send(store, binary.key):
                continue
            files = {name: Path(path).read_bytes() for name, path in binary.files.items()}
            group = next(name for name in files if name.endswith(".json"))
            files[GROUP + group] = json.dumps(sorted(binary.files)).encode()
            put(binary.key, files)
        except Exception as exc:  # noqa: BLE001 - not kept; another machine compiles it
            log.info("gemmtune: kernel %s not kept in the store: %s", binary.key, exc)
            continue
        _STATE["published"].add((id(store), binary.key))
        written += 1
    return written


def _to_send(store: Any, key: str) -> bool:
    """Whether `key`'s files still have to be written to `store`: not by this process (`published`),
    nor by another (a kernel this process found in its own cache, which the store holds already)."""
    if (id(store), key) in _STATE["published"]:
        return False
    if getattr(store, "has_kernel_files", lambda key: False)(key):
        _STATE["published"].add((id(store), key))
        return False
    return True


def _served(key: str) -> None:
    """A kernel the store served: nothing to keep there again (`publish` skips it)."""
    store = _STATE["store"]
    if store is not None:
        _STATE["published"].add((id(store), key))


def _fetch(key: str) -> dict[str, bytes]:
    store = _STATE["store"]
    if store is None:
        return {}
    try:
        return store.kernel_files(key)
    except Exception as exc:  # noqa: BLE001 - a cache miss, never a failed compile
        log.info("gemmtune: the store did not answer for kernel %s: %s", key, exc)
        return {}


def _keep_native(key: str, filename: str, path: str) -> None:
    """A native module built or found on disk: kept by the next `publish` (in the thread that tunes;
    compile threads do not write to the store), once per process."""
    if _STATE["store"] is not None:
        with _LOCK:
            _STATE["native"][key] = (filename, path)


def _triton_key(store: Any, sig: str) -> str | None:
    """Triton's key kept under its wheel's signature `sig`, or None."""
    data = store.kernel_files(KEY_PREFIX + sig).get("key")
    return data.decode() if data else None


def _keep_key(sig: str, key: str) -> None:
    """A key Triton computed (maybe in a compile thread): written by the next `publish`."""
    with _LOCK:
        _STATE["keys"][sig] = key


def _publish_pending(store: Any) -> None:
    """Write what was met since the last `publish`: native modules, and Triton's key of itself."""
    with _LOCK:
        native, keys = _STATE["native"], _STATE["keys"]
        _STATE["native"], _STATE["keys"] = {}, {}
    for key, (filename, path) in native.items():
        _send(store, key, lambda: {filename: Path(path).read_bytes()}, f"native module {filename}")
    for sig, triton_key in keys.items():
        _send(store, KEY_PREFIX + sig, lambda: {"key": triton_key.encode()}, "Triton's key")


def _send(store: Any, key: str, files: Callable[[], dict[str, bytes]], what: str) -> None:
    """`files()` written under `key` where the store lacks them; a failure is logged, never raised."""
    try:
        if _to_send(store, key):
            store.put_kernel_files(key, files())
            _STATE["published"].add((id(store), key))
    except Exception as exc:  # noqa: BLE001 - not kept; the next machine builds or hashes it
        log.info("gemmtune: %s not kept in the store: %s", what, exc)


__all__ = ["StoreCacheManager", "share", "stop_sharing", "sharing", "publish", "GROUP"]
