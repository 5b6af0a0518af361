"""Compiled CUTLASS (CuTe DSL) kernels kept on disk, so that another process loads them instead of compiling.

The DSL's JIT compile takes about 1.3-2 s per operator on the H200 host, serialised (its tracing is
not thread-safe); within a process the template keeps each binary.  Here each compiled kernel is
also exported with the DSL's ahead-of-time path (`JitCompiledFunction.export_to_c`: an object file
holding the host launcher and the cubin) and read back in a later process with
`cutlass.runtime.load_module`.

The file's name is a digest of everything the binary depends on: the template's `src_hash` (its
source, the library's and the DSL's versions), the compile-time config, dtype, op, operand layouts,
the GPU architecture and its SM count (`launch.disk_key`).  A file that fails to load is compiled
again and replaced; a kernel that fails to export is still used, only not kept.
`GEMMTUNE_CUTLASS_DISK=0` turns the disk off.

Example:
    >>> p = kernel_path(("cfg", "bf16"), "abc", "sm_90a", root=Path("/tmp/k"))
    >>> p.parent.name, p.suffix, p == kernel_path(("cfg", "bf16"), "abc", "sm_90a", root=Path("/tmp/k"))
    ('cutedsl_kernels', '.o', True)
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("gemmtune")
PREFIX = "gemmtune_hopper"  # the exported function's symbol prefix (one function per file)


def enabled() -> bool:
    """Whether compiled kernels go to disk (`GEMMTUNE_CUTLASS_DISK`, a boolean read like the
    settings' booleans; default on)."""
    from ...core.errors import SettingsError
    from ...core.spec import parse_bool

    raw = os.environ.get("GEMMTUNE_CUTLASS_DISK", "").strip()
    try:
        return True if not raw else parse_bool(raw)
    except ValueError as exc:
        raise SettingsError(f"GEMMTUNE_CUTLASS_DISK: {exc}") from None


def kernel_path(key: tuple, src_hash: str, arch: str, root: Path | None = None) -> Path:
    """Where the kernel of `key` (compiled from the source of `src_hash` for `arch`) is kept."""
    if root is None:
        from ...core.settings import cache_dir

        root = cache_dir()
    digest = hashlib.sha256(repr((key, src_hash, arch)).encode()).hexdigest()[:40]
    return root / "cutedsl_kernels" / f"k{digest}.o"


def load(path: Path) -> Any | None:
    """The kernel kept at `path`, or None (absent, or unreadable: logged, compiled again)."""
    if not path.is_file():
        return None
    try:
        from cutlass.runtime import load_module

        return getattr(load_module(str(path)), PREFIX)
    except Exception as exc:  # noqa: BLE001 - a bad file costs a compile, never a failure
        log.info("gemmtune: cutlass: kept kernel %s did not load (%s: %s); compiling it again",
                 path.name, type(exc).__name__, exc)
        return None


def save(compiled: Any, path: Path) -> bool:
    """Export `compiled` to `path` (written under a temporary name, then renamed: a reader never sees
    half a file).  Returns whether it was kept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            compiled.export_to_c(tmp, "kernel", PREFIX)
            os.replace(Path(tmp) / "kernel.o", path)
        return True
    except Exception as exc:  # noqa: BLE001 - not kept: the next process compiles it again
        log.info("gemmtune: cutlass: compiled kernel not kept on disk (%s: %s)", type(exc).__name__, exc)
        return False


def load_or_compile(key: tuple, src_hash: str | None, arch: str, compile_fn: Callable[[], Any]) -> Any:
    """The kernel of `key` from disk, else `compile_fn()` kept on disk for the next process.
    Without a `src_hash` (or with the disk turned off) it only compiles."""
    if src_hash is None or not enabled():
        return compile_fn()
    path = kernel_path(key, src_hash, arch)
    kept = load(path)
    if kept is not None:
        return kept
    compiled = compile_fn()
    save(compiled, path)
    return compiled


def bind_context(device: Any) -> bool:
    """Make the GPU's primary CUDA context current in this thread, where none is; returns whether
    it bound one.  A compile thread that never made a CUDA call has no current context, and the DSL
    loads a kept or freshly compiled module through the driver API, which then fails with
    CUDA_ERROR_INVALID_CONTEXT (seen on the H200 for every operator an addmm tune loaded from disk).
    torch's `set_device` does not help there: it skips a device that is already the thread's current
    one.  No CUDA driver bindings (`cuda.bindings`, a dependency of the DSL): nothing to do.

    `device`: a GPU index, a `torch.device` (a CPU one, or None: nothing to do).

    Example:
        >>> bind_context(None)
        False
    """
    if device is not None and not isinstance(device, int):
        device = (device.index or 0) if device.type == "cuda" else None
    if device is None:
        return False
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    try:
        return _bind(driver, device)
    except Exception as exc:  # noqa: BLE001 - never the reason a compile fails: the DSL reports its own error
        log.debug("gemmtune: no CUDA context bound in this thread: %s", exc)
        return False


def _bind(driver: Any, index: int) -> bool:
    ok = driver.CUresult.CUDA_SUCCESS
    err, ctx = driver.cuCtxGetCurrent()
    if err == ok and ctx is not None and int(ctx) != 0:
        return False
    err, dev = driver.cuDeviceGet(index)
    if err != ok:
        return False
    err, primary = driver.cuDevicePrimaryCtxRetain(dev)
    if err != ok:
        return False
    (err,) = driver.cuCtxSetCurrent(primary)
    return bool(err == ok)
