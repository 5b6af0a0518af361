"""Compiled kernels in the store (`Settings.share_kernels`), so a machine that shares the store loads a
pick instead of compiling it.

Triton keeps what it compiles in an on-disk cache, one directory per key, and asks a cache manager
class for it (`triton.knobs.cache.manager_class`, its plug-in point).  `StoreCacheManager` is Triton's
own `FileCacheManager` with the store behind it, in place only around gemmtune's own compiles and
loads (`templates.compiler_cache.scope`, entered in each compile thread), never process-wide:

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
once: a process that finds it there already (`has_kernel_files`) does not send it again.

The store then holds host and GPU code that a process loads, so kernels are taken from and kept in a
store only where it has a key (`Settings.store_key`): each file is signed, and only files that verify
are served (`store.kernel_entries`); a native module too.  Without a key nothing is shared, said once
per process (`keyed`).  What is served is bounded before it is written to disk (`MAX_FILE_BYTES` a
file, `MAX_KERNEL_BYTES` a kernel; over them: a cache miss).

Example:
    >>> from gemmtune.store.signing import Signer
    >>> from gemmtune.store.sqlite import Store
    >>> from gemmtune.store.trust import Trust
    >>> store = Store(":memory:", trust=Trust(Signer.from_text("a-fleet-secret-of-32-characters!")))
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
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

from ..templates import compiler_cache
from ..templates.compiler_cache import scope
from ..templates.triton import wheel_key
from .kernel_entries import MAX_FILE_BYTES, MAX_KERNEL_BYTES

log = logging.getLogger("gemmtune")

GROUP = "__grp__"  # Triton's prefix for a kernel's group file; the store keeps its members' names there
_NATIVE = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
_STATE: dict[str, Any] = {"store": None, "published": set(), "native": {}, "keys": {}}
KEY_PREFIX = "triton_key:"  # Triton's key of its installation, under its wheel's signature (`wheel_key`)
_LOCK = threading.Lock()
_SAID: set[str] = set()  # what this process was told once
MAX_KEY_BYTES = 64 << 10  # Triton's key of its installation (about 2 kB)

try:
    from triton.runtime.cache import FileCacheManager as _Base
except ImportError:  # no Triton: nothing to share
    _Base = object  # type: ignore[assignment,misc]


class StoreCacheManager(_Base):  # type: ignore[misc,valid-type]
    """Triton's file cache, with the shared store answering what the local cache lacks (see the module).
    Triton's override and dump caches (`TRITON_KERNEL_OVERRIDE`, `TRITON_KERNEL_DUMP`) stay local."""

    def __init__(self, key: str, override: bool = False, dump: bool = False):
        super().__init__(key, override, dump)
        # Only gemmtune's own compiles (`compiler_cache.scope`): another thread's is Triton's own cache.
        self.shared = not (override or dump) and compiler_cache.in_scope() and _STATE["store"] is not None

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
            if data is None or not _plain(filename) or not _bounded(self.key, {filename: data}):
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
        if names is None or not _bounded(self.key, {name: files[name] for name in names}):
            return None
        paths = {name: super(StoreCacheManager, self).put(files[name], name, binary=True) for name in names}
        super().put_group(filename, paths)
        _served(self.key)
        log.info("gemmtune: kernel %s loaded from the store (%d files)", filename, len(paths))
        return paths

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path = super().put(data, filename, binary=binary)
        if filename.endswith(_NATIVE) and self.shared:
            _keep_native(self.key, filename, path)
        return path


def _bounded(key: str, files: dict[str, bytes]) -> bool:
    """Whether files the store served are small enough to be written to disk (`MAX_FILE_BYTES` each,
    `MAX_KERNEL_BYTES` together); else a cache miss, said in one line."""
    sizes = [len(data) for data in files.values()]
    if all(size <= MAX_FILE_BYTES for size in sizes) and sum(sizes) <= MAX_KERNEL_BYTES:
        return True
    log.warning("gemmtune: kernel %s not served from the store: %d bytes, over the bounds (%d a file, %d a kernel)",
                key, sum(sizes), MAX_FILE_BYTES, MAX_KERNEL_BYTES)
    return False


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
    """Serve Triton's cache misses in gemmtune's own compiles from `store` (`compiler_cache.scope`: never
    another compile of the process), and keep native modules there (later calls switch to their store).
    False where it cannot: no Triton, a store without a key (`keyed`), or another cache manager set.

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> from gemmtune.store.signing import Signer
        >>> from gemmtune.store.trust import Trust
        >>> store = Store(":memory:", trust=Trust(Signer.from_text("a-fleet-secret-of-32-characters!")))
        >>> share(store) in (True, False); stop_sharing()
        True
    """
    if _Base is object or not hasattr(store, "kernel_files") or not keyed(store):
        return False
    from triton import knobs

    current = knobs.cache.manager_class
    if current is not None and current is not StoreCacheManager:
        if current not in _STATE.setdefault("refused", set()):  # said once per process and manager
            _STATE["refused"].add(current)
            log.warning("gemmtune: share_kernels: Triton already uses cache manager %s; kernels are not shared",
                        getattr(current, "__name__", current))
        return False
    compiler_cache.serve(StoreCacheManager)
    with _LOCK:
        if _STATE["store"] is not store:
            _STATE.update(store=store, published=set(), native={}, keys={})
    wheel_key.share_with(lambda sig: _triton_key(store, sig), _keep_key)
    return True


def keyed(store: Any) -> bool:
    """Whether `store` signs what it keeps and serves only what verifies (`Settings.store_key`): the
    only store compiled kernels are taken from or kept in.  Where not, said once per process.

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> from gemmtune.store.signing import Signer
        >>> from gemmtune.store.trust import Trust
        >>> keyed(Store(":memory:", trust=Trust(Signer.from_text("a-fleet-secret-of-32-characters!"))))
        True
    """
    if getattr(getattr(store, "trust", None), "signer", None) is not None:
        return True
    with _LOCK:
        said = "store_key" in _SAID
        _SAID.add("store_key")
    if not said:
        message = (f"gemmtune: share_kernels needs store_key: no compiled kernel is served from or kept in store "
                   f"{getattr(store, 'path', '?')} without one (GEMMTUNE_STORE_KEY); a store anyone can write "
                   "is never offered code")
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    return False


def stop_sharing() -> None:
    """Triton's own cache manager again in gemmtune's compiles, and no store behind it."""
    compiler_cache.serve(None)
    wheel_key.unshare()
    with _LOCK:
        _STATE.update(store=None, published=set(), native={}, keys={})


def sharing(store: Any) -> None:
    """What a tune asks for: share `store`'s kernels (`share`), or none (None: `stop_sharing`, where this
    process shared a store before).

    Example:
        >>> sharing(None)
    """
    if store is not None and share(store):
        return
    if _STATE["store"] is not None or compiler_cache.served() is not None:
        stop_sharing()


def publish(store: Any, binaries: Iterable[Any]) -> int:
    """Keep each binary's files in `store` (`templates.binaries.BinaryFiles`: a key and name -> path),
    with a group entry naming them, and the native modules met since the last call; returns how many
    binaries were written (never raises).  Each is written once per process; a file that cannot be
    read is skipped with its binary.  A store without a key keeps none (`keyed`)."""
    put = getattr(store, "put_kernel_files", None)
    if put is None or not keyed(store):
        return 0
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
    if store is None or getattr(store.trust, "signer", None) is None:  # only what verifies under the key
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
    """Triton's key kept under its wheel's signature `sig`, or None (`wheel_key` checks its form)."""
    data = store.kernel_files(KEY_PREFIX + sig).get("key")
    if not data:
        return None
    try:
        if len(data) > MAX_KEY_BYTES:
            raise ValueError(f"{len(data)} bytes")
        return data.decode("ascii")
    except ValueError as exc:  # UnicodeDecodeError included
        log.warning("gemmtune: store %s: Triton's key under %s%s is malformed (%s); Triton hashes itself",
                    getattr(store, "path", "?"), KEY_PREFIX, sig[:16], exc)
        return None


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


__all__ = ["StoreCacheManager", "share", "stop_sharing", "sharing", "publish", "keyed", "scope", "GROUP"]
