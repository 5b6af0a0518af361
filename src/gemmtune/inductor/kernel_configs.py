"""The configs Inductor tunes for pointwise and reduction kernels, kept in gemmtune's store.

In a default-mode compile gemmtune has Inductor tune a few kernels it would otherwise not: a
matrix-vector product's reduction and an outer product's multiply (`inductor.gemv`).  Inductor keeps
the config it picks for a kernel in its own cache directory (a `.best_config` file beside the kernel),
so a new machine, or a new Inductor cache, compiles and times every config of those kernels again
(on the stack at M = 1: 16 reductions, about half of a warm-store compile).  Here:

- **kept**: when such a kernel's configs have been timed (or tuned by coordinate descent), the pick
  is written to the store, under Inductor's lookup-table hash of the kernel's source and size hints
  (`triton_heuristics.generate_lookup_hash_from_source_code`) and the device's env key (a descent's
  pick under a key of its own, served first);
- **served**: when Inductor hands a kernel's source to its compile (`AsyncCompile.triton`, in the
  compiling process, before any compile worker sees it), a config the store holds for it is put in
  Inductor's lookup table (`config.autotune_lookup_table`) for that call only.  Inductor then
  compiles that one config and times nothing, in a compile worker as in-process.  The table is
  patched per call, so it never enters the key of Inductor's FX-graph cache.

Every fused kernel (the kernels Inductor's table serves) is looked up, and only a config made of
block sizes, warps and stages is kept (what the table can give back).  So the pointwise kernels a
default compile times itself (`triton.autotune_pointwise`) are served too, and under max-autotune
every pointwise and reduction kernel.  A config found by descent is served marked so, and not
descended from again.  `keep(store_of)` turns it on (`install()` does, with the handler's store);
`keep(None)` off; Inductor's `force_disable_caches` turns it off too.  `stats` counts configs "kept", lookups "served" and "missed".

A config read from the store is untrusted input (`parse_entry`): a JSON object of `entry_of`'s keys
only, block sizes that are powers of two within Inductor's bounds, warps and stages Triton takes, a
few hundred bytes.  Anything else is skipped with one warning naming the store and the key, and
counted ("skipped"); Inductor then tunes that kernel as it would without the store.

Example:
    >>> servable("@triton.jit\\ndef triton_red_fused_sum_0(in_ptr0, out_ptr0, xnumel, r0_numel):\\n    pass\\n")
    True
"""

from __future__ import annotations

import functools
import json
import logging
import warnings
from typing import Any, Callable

__all__ = ["keep", "report", "servable", "lookup_hash", "entry_of", "parse_entry", "stats", "PREFIX", "FILE"]

log = logging.getLogger("gemmtune")
PREFIX = "inductor_config:"  # store key: PREFIX + env key + ":" + lookup hash
FILE = "config.json"
_STATE: dict[str, Any] = {"store_of": None, "served": {}, "kept": [], "missed": []}  # hashes, for a report
stats: dict[str, int] = {"kept": 0, "served": 0, "missed": 0, "skipped": 0}
# What a stored entry may hold: Inductor's block sizes with their bounds (`runtime.hints.TRITON_MAX_BLOCK`),
# the warps and stages Triton takes, and whether a descent found it.
_BLOCKS = {"XBLOCK": 8192, "YBLOCK": 1024, "ZBLOCK": 1024, "R0_BLOCK": 65536, "R1_BLOCK": 32768, "RBLOCK": 65536}
_MAX_NUMEL = 1 << 20  # Triton's most elements in one block (`TRITON_MAX_TENSOR_NUMEL`)
_WARPS = (1, 2, 4, 8, 16, 32)
_MAX_STAGES = 8
MAX_ENTRY_BYTES = 1024


def servable(source_code: str) -> bool:
    """Whether Inductor's lookup table can serve a kernel module's source a config: a fused Triton kernel."""
    return "_fused_" in source_code and "@triton.jit\n" in source_code


def lookup_hash(source_code: str) -> str | None:
    """Inductor's lookup-table hash of a kernel module's source, as `AsyncCompile.triton` computes it;
    None where this torch has no such table or the source is not a Triton kernel's."""
    try:
        from torch._inductor.async_compile import size_hints_regex
        from torch._inductor.runtime.triton_heuristics import generate_lookup_hash_from_source_code
    except ImportError:  # a torch without Inductor's lookup table of kernel configs
        return None
    if "@triton.jit\n" not in source_code:
        return None
    found = size_hints_regex.search(source_code)
    return generate_lookup_hash_from_source_code(found.group(1) if found else str(None),
                                                 source_code.split("@triton.jit\n")[1])


def entry_of(config: Any, found_by_coordesc: bool = False) -> dict[str, Any] | None:
    """A Triton config as the lookup table's entry (its block sizes, warps, stages), or None when it
    holds anything the table cannot give back.

    Example:
        >>> class C: kwargs, num_warps, num_stages, num_ctas, maxnreg = {"XBLOCK": 1, "R0_BLOCK": 2048}, 8, 1, 1, None
        >>> entry_of(C())
        {'XBLOCK': 1, 'R0_BLOCK': 2048, 'num_warps': 8, 'num_stages': 1, 'found_by_coordesc': False}
    """
    kwargs = dict(getattr(config, "kwargs", None) or {})
    if not all("BLOCK" in k and isinstance(v, int) for k, v in kwargs.items()):
        return None
    if getattr(config, "num_ctas", 1) not in (1, None) or getattr(config, "maxnreg", None) is not None:
        return None
    return {**kwargs, "num_warps": int(config.num_warps), "num_stages": int(config.num_stages),
            "found_by_coordesc": bool(found_by_coordesc)}


def parse_entry(data: bytes) -> dict[str, Any] | str:
    """The lookup table's entry a store holds (`entry_of`'s form), or why it is not one.

    Example:
        >>> parse_entry(b'{"XBLOCK": 1, "R0_BLOCK": 2048, "num_warps": 8, "num_stages": 1}')["R0_BLOCK"]
        2048
        >>> parse_entry(b"[1, 2, 3]"), parse_entry(b'{"XBLOCK": 3, "num_warps": 8, "num_stages": 1}')
        ('not a JSON object', 'XBLOCK=3 is not a power of two from 1 to 8192')
    """
    if not isinstance(data, bytes) or len(data) > MAX_ENTRY_BYTES:
        return f"more than {MAX_ENTRY_BYTES} bytes"
    try:
        entry = json.loads(data)
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(entry, dict):
        return "not a JSON object"
    unknown = sorted(set(entry) - set(_BLOCKS) - {"num_warps", "num_stages", "found_by_coordesc"})
    if unknown or "num_warps" not in entry or "num_stages" not in entry:
        return f"keys other than a config's ({', '.join(unknown[:3]) or 'num_warps or num_stages missing'})"
    numel = 1
    for name, top in _BLOCKS.items():
        value = entry.get(name, 1)
        if type(value) is not int or not 1 <= value <= top or value & (value - 1):
            return f"{name}={value!r:.20} is not a power of two from 1 to {top}"
        numel *= value
    if numel > _MAX_NUMEL:
        return f"blocks of {numel} elements, over {_MAX_NUMEL}"
    warps, stages = entry["num_warps"], entry["num_stages"]
    if type(warps) is not int or warps not in _WARPS or type(stages) is not int or not 1 <= stages <= _MAX_STAGES:
        return f"num_warps={warps!r:.20}, num_stages={stages!r:.20}: not warps in {_WARPS} and stages in 1..{_MAX_STAGES}"
    if type(entry.get("found_by_coordesc", False)) is not bool:
        return "found_by_coordesc is not a boolean"
    return entry


@functools.lru_cache(maxsize=None)
def _env() -> str:
    from ..store.keys import env_info, env_key

    return env_key(env_info("cuda"))


def _key(fn_hash: str, descended: bool = False) -> str:
    """The store key of a kernel's timed pick, or of its descent's pick (`descended`): a store keeps
    the first entry written under a key, so a descent's pick is not shadowed by a timed one."""
    return f"{PREFIX}{_env()}:{fn_hash}" + (":descent" if descended else "")


def _stored(fn_hash: str) -> dict[str, Any] | None:
    store_of = _STATE["store_of"]
    if store_of is None:
        return None
    try:
        store = store_of()
        for descended in (True, False):  # a descent's pick first: it is at least as good as the timed one
            key = _key(fn_hash, descended)
            data = store.kernel_files(key).get(FILE)
            entry = parse_entry(data) if data else None
            if isinstance(entry, str):
                _skipped(store, key, entry)
            elif entry is not None:
                return entry
        return None
    except Exception as exc:  # noqa: BLE001 - a store that fails to answer: Inductor tunes, as without it
        log.info("gemmtune: a kernel config was not read from the store: %s", exc)
        return None


def _skipped(store: Any, key: str, why: str) -> None:
    """A stored config that is not one: counted, and said once per process, store and key."""
    where = str(getattr(store, "path", "?"))
    if (where, key) in _STATE.setdefault("skipped", set()):
        return
    _STATE["skipped"].add((where, key))
    stats["skipped"] += 1
    message = f"gemmtune: store {where}: kernel config {key} skipped: {why}"
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=2)


def _serving() -> bool:
    """On, and Inductor's caches not switched off (`force_disable_caches`: every config timed afresh)."""
    from torch._inductor import config

    return _STATE["store_of"] is not None and not getattr(config, "force_disable_caches", False)


def _wrap_triton(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def triton(self: Any, kernel_name: str, source_code: str, *args: Any, **kwargs: Any) -> Any:
        fn_hash = lookup_hash(source_code) if _serving() and servable(source_code) else None
        entry = _stored(fn_hash) if fn_hash else None
        if entry is None:
            if fn_hash is not None:
                stats["missed"] += 1
                _STATE["missed"].append(fn_hash[:12])
            return fn(self, kernel_name, source_code, *args, **kwargs)
        from torch._inductor import config

        stats["served"] += 1
        _STATE["served"][fn_hash] = bool(entry.get("found_by_coordesc"))
        with config.patch(autotune_lookup_table={**config.autotune_lookup_table, fn_hash: entry}):
            return fn(self, kernel_name, source_code, *args, **kwargs)

    triton.__gemmtune_configs__ = fn  # type: ignore[attr-defined]
    return triton


class _Keeper:
    """A kernel's `save_cache_hook`: Inductor's own hook, then the config kept in the store."""

    def __init__(self, prior: Any, fn_hash: str):
        self.prior, self.fn_hash = prior, fn_hash

    def __call__(self, config: Any, *args: Any, found_by_coordesc: bool = False, **kwargs: Any) -> Any:
        out = self.prior(config, *args, found_by_coordesc=found_by_coordesc, **kwargs) if self.prior else None
        descended = bool(getattr(config, "found_by_coordesc", False))
        if found_by_coordesc and not descended:  # timed, with a descent to follow: the descent's pick is kept
            return out
        entry, store_of = entry_of(config, descended), _STATE["store_of"]
        if entry is not None and store_of is not None:
            try:
                store_of().put_kernel_files(_key(self.fn_hash, descended), {FILE: json.dumps(entry, sort_keys=True).encode()})
                stats["kept"] += 1
                _STATE["kept"].append(self.fn_hash[:12])
            except Exception as exc:  # noqa: BLE001 - not kept: the next new cache times it again
                log.info("gemmtune: a kernel config was not kept in the store: %s", exc)
        return out


def _attach(kernel: Any) -> None:
    """After `precompile` in the compiling process: a kernel with configs to time, or to descend
    from, keeps its pick; one served a descent's pick is not descended from again."""
    from torch._inductor.runtime.triton_heuristics import generate_lookup_hash_from_source_code

    launchers, meta = getattr(kernel, "launchers", None) or [], getattr(kernel, "inductor_meta", None) or {}
    src = getattr(getattr(kernel, "fn", None), "src", None)
    if not launchers or not isinstance(src, str) or "_fused_" not in src or meta.get("force_disable_caches"):
        return
    fn_hash = generate_lookup_hash_from_source_code(str(getattr(kernel, "size_hints", None)), src)
    if len(launchers) > 1 and _chosen(kernel, fn_hash):  # built with every config (Inductor's bundle of a cached graph)
        launchers = kernel.launchers
    if _STATE["served"].get(fn_hash) and len(launchers) == 1:
        launchers[0].config.found_by_coordesc = True
    descends = meta.get("coordinate_descent_tuning") and not getattr(launchers[0].config, "found_by_coordesc", False)
    if (len(launchers) > 1 or descends) and not isinstance(kernel.save_cache_hook, _Keeper):
        kernel.save_cache_hook = _Keeper(kernel.save_cache_hook, fn_hash)


def _chosen(kernel: Any, fn_hash: str) -> bool:
    """Keep only the launcher of the stored config, where a kernel was built with all of them (its
    configs came from elsewhere than the compile this module serves: Inductor's bundle of a cached
    graph's kernels); False when the store holds none of its configs."""
    entry = _stored(fn_hash)
    if entry is None:
        return False
    descended = bool(entry.get("found_by_coordesc"))
    chosen = [launcher for launcher in kernel.launchers if entry_of(launcher.config, descended) == entry]
    if not chosen:
        return False
    kernel.launchers = chosen[:1]
    _STATE["served"][fn_hash] = descended
    stats["served"] += 1
    return True


def _wrap_precompile(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def precompile(self: Any, warm_cache_only: bool = False, *args: Any, **kwargs: Any) -> Any:
        out = fn(self, warm_cache_only, *args, **kwargs)
        if not warm_cache_only and _STATE["store_of"] is not None:
            try:
                _attach(self)
            except Exception as exc:  # noqa: BLE001 - a kernel we cannot read: Inductor's own caching only
                log.debug("gemmtune: kernel config not followed: %s", exc)
        return out

    precompile.__gemmtune_configs__ = fn  # type: ignore[attr-defined]
    return precompile


def _hook() -> bool:
    """Wrap `AsyncCompile.triton` and `CachingAutotuner.precompile` once per process; False where
    this torch lacks either, or Inductor's lookup table of kernel configs."""
    try:
        from torch._inductor import config
        from torch._inductor.async_compile import AsyncCompile
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except Exception:  # noqa: BLE001 - no Triton runtime for Inductor here
        return False
    if not isinstance(getattr(config, "autotune_lookup_table", None), dict) or lookup_hash("@triton.jit\n") is None:
        return False
    for owner, name, wrap in ((AsyncCompile, "triton", _wrap_triton),
                              (CachingAutotuner, "precompile", _wrap_precompile)):
        fn = getattr(owner, name, None)
        if fn is None:
            return False
        if not hasattr(fn, "__gemmtune_configs__"):
            setattr(owner, name, wrap(fn))
    return True


def report() -> dict[str, Any]:
    """`stats` and the hashes (12 hex digits) of the kernels kept and of the lookups missed, in order.

    Example:
        >>> sorted(report())
        ['kept', 'kept_hashes', 'missed', 'missed_hashes', 'served', 'skipped']
    """
    return {**stats, "kept_hashes": list(_STATE["kept"]), "missed_hashes": list(_STATE["missed"])}


def keep(store_of: Callable[[], Any] | None) -> bool:
    """Keep and serve tuned kernel configs through the store `store_of()` gives (None: stop); False
    where this torch cannot (nothing is hooked then).

    Example:
        >>> from gemmtune.store.sqlite import Store
        >>> store = Store(":memory:")
        >>> keep(lambda: store) in (True, False), keep(None)
        (True, False)
    """
    if store_of is None:
        _STATE["store_of"] = None
        return False
    if not _hook():
        return False
    _STATE["store_of"] = store_of
    return True
