"""Configs Inductor tunes for its own kernels, kept in the store and served to a new Inductor cache
(`inductor.kernel_configs`).  Inductor's CPU kernels are not Triton, so the two hooks are driven here
with Inductor's own hash, lookup and config objects and a kernel stand-in; the whole path (a new
Inductor cache compiling one config, timing none) runs on the GPU in tests/gpu/test_inductor_gpu.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import gemmtune.inductor as gi
from gemmtune.inductor import kernel_configs as kc
from gemmtune.store.sqlite import Store

from helpers import fresh_inductor  # noqa: F401 - the fixture

pytestmark = [pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table"),
              pytest.mark.usefixtures("fresh_inductor")]

SIZE_HINTS = {"x": 1, "r0_": 4096}
FN_SRC = ("def triton_red_fused_mul_sum_0(in_ptr0, in_ptr1, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr, "
          "R0_BLOCK : tl.constexpr):\n    xnumel = 1\n    r0_numel = 4096\n")
MODULE = ("import triton\n@triton_heuristics.reduction(\n    size_hints=" + repr(SIZE_HINTS) + ",\n"
          "    reduction_hint=ReductionHint.INNER,\n    inductor_meta={'max_autotune_pointwise': True, "
          "'coordinate_descent_tuning': False},\n)\n@triton.jit\n" + FN_SRC)


@pytest.fixture
def store(monkeypatch):
    db = Store(":memory:")
    monkeypatch.setattr(kc, "_env", lambda: "E")  # the device's env key (a GPU's name and versions)
    for name, empty in (("served", {}), ("kept", []), ("missed", []), ("skipped", set())):
        monkeypatch.setitem(kc._STATE, name, empty)
    for k in kc.stats:
        monkeypatch.setitem(kc.stats, k, 0)
    assert kc.keep(lambda: db)
    yield db
    kc.keep(None)


def _config(**kw):
    from torch._inductor.runtime.triton_compat import Config

    return Config(kw, num_warps=8, num_stages=1)


def _kernel(*configs, coordesc=False):
    """What `precompile` leaves: launchers, Inductor's own save hook, the source and size hints."""
    saved = []
    kernel = SimpleNamespace(launchers=[SimpleNamespace(config=c) for c in configs], fn=SimpleNamespace(src=FN_SRC),
                             size_hints=dict(SIZE_HINTS), inductor_meta={"coordinate_descent_tuning": coordesc},
                             save_cache_hook=lambda config, ns, found_by_coordesc=False, **kw: saved.append(config))
    return kernel, saved


def test_the_hash_of_a_module_source_is_the_one_a_compile_worker_looks_up():
    from torch._inductor.runtime.triton_heuristics import generate_lookup_hash_from_source_code

    assert kc.servable(MODULE)
    assert kc.lookup_hash(MODULE) == generate_lookup_hash_from_source_code(str(SIZE_HINTS), FN_SRC)
    assert not kc.servable(MODULE.replace("_fused_", "_"))  # Inductor's table serves fused kernels only
    assert kc.lookup_hash("def not_a_kernel(): pass\n") is None


def test_a_timed_kernel_keeps_its_pick_and_a_new_cache_is_served_it_for_that_call_only(store):
    from torch._inductor import config
    from torch._inductor.runtime.triton_heuristics import lookup_autotune_config

    kernel, saved = _kernel(_config(XBLOCK=1, R0_BLOCK=1024), _config(XBLOCK=1, R0_BLOCK=2048))
    kc._attach(kernel)
    best = kernel.launchers[1].config
    kernel.save_cache_hook(best, 1000, found_by_coordesc=False)
    assert saved == [best] and kc.stats["kept"] == 1  # Inductor's own hook still runs
    seen = []

    def compile_source(self, kernel_name, source_code):  # Inductor's AsyncCompile.triton, as a worker sees it
        seen.append(lookup_autotune_config(SIZE_HINTS, SimpleNamespace(src=FN_SRC)))
        return kernel_name

    assert kc._wrap_triton(compile_source)(None, "k", MODULE) == "k"
    (served,) = seen
    assert (served.kwargs, served.num_warps, served.num_stages) == ({"XBLOCK": 1, "R0_BLOCK": 2048}, 8, 1)
    assert config.autotune_lookup_table == {}  # patched for the call only: not in the FX-graph cache key
    assert kc.stats["served"] == 1


def test_a_source_the_store_lacks_compiles_as_inductor_would(store):
    from torch._inductor import config

    tables = []
    kc._wrap_triton(lambda self, name, src: tables.append(dict(config.autotune_lookup_table)))(None, "k", MODULE)
    assert tables == [{}] and kc.stats == {"kept": 0, "served": 0, "missed": 1, "skipped": 0}


def test_a_descent_keeps_its_own_pick_not_the_timed_one_it_starts_from(store):
    start = _config(XBLOCK=1, R0_BLOCK=1024)
    kernel, _ = _kernel(start, coordesc=True)
    kc._attach(kernel)
    kernel.save_cache_hook(start, 10, found_by_coordesc=True)  # after timing, before the descent
    assert kc.stats["kept"] == 0
    found = _config(XBLOCK=1, R0_BLOCK=512)
    found.found_by_coordesc = True
    kernel.save_cache_hook(found, 20, found_by_coordesc=True)
    (data,) = store.kernel_files(kc._key(kc.lookup_hash(MODULE), descended=True)).values()
    assert json.loads(data) == {"XBLOCK": 1, "R0_BLOCK": 512, "num_warps": 8, "num_stages": 1,
                                "found_by_coordesc": True}
    served, _ = _kernel(_config(XBLOCK=1, R0_BLOCK=512), coordesc=True)  # a new cache, served that pick
    kc._wrap_triton(lambda self, name, src: None)(None, "k", MODULE)
    kc._attach(served)
    assert served.launchers[0].config.found_by_coordesc  # not descended from again
    assert not hasattr(served.save_cache_hook, "fn_hash")


def test_a_kernel_with_one_config_and_no_descent_keeps_nothing(store):
    kernel, _ = _kernel(_config(XBLOCK=1, R0_BLOCK=1024))
    hook = kernel.save_cache_hook
    kc._attach(kernel)
    assert kernel.save_cache_hook is hook


def test_a_config_the_table_cannot_give_back_is_not_kept():
    odd = _config(XBLOCK=1, R0_BLOCK=1024)
    odd.kwargs["waves_per_eu"] = 2
    assert kc.entry_of(odd) is None
    assert kc.entry_of(_config(XBLOCK=4)) == {"XBLOCK": 4, "num_warps": 8, "num_stages": 1, "found_by_coordesc": False}


def test_a_failing_store_leaves_inductor_to_tune(monkeypatch):
    class Broken:
        def kernel_files(self, key):
            raise OSError("store down")

        def put_kernel_files(self, key, files):
            raise OSError("store down")

    monkeypatch.setattr(kc, "_env", lambda: "E")
    kc.keep(Broken)
    try:
        assert kc._wrap_triton(lambda self, name, src: "compiled")(None, "k", MODULE) == "compiled"
        kernel, saved = _kernel(_config(XBLOCK=1, R0_BLOCK=1024), _config(XBLOCK=1, R0_BLOCK=2048))
        kc._attach(kernel)
        kernel.save_cache_hook(kernel.launchers[0].config, 5)
        assert len(saved) == 1
    finally:
        kc.keep(None)


def test_install_serves_through_the_handlers_store_and_uninstall_stops():
    gi.install(tune_on_miss=False)
    assert kc._STATE["store_of"] is not None
    gi.uninstall()
    assert kc._STATE["store_of"] is None


def test_a_kernel_built_with_every_config_keeps_only_the_stored_ones_launcher(store):
    """Inductor's bundle of a cached graph's kernels brings them back with every config built."""
    first, _ = _kernel(_config(XBLOCK=1, R0_BLOCK=1024), _config(XBLOCK=1, R0_BLOCK=2048))
    kc._attach(first)
    first.save_cache_hook(first.launchers[1].config, 1000)
    again, saved = _kernel(_config(XBLOCK=1, R0_BLOCK=1024), _config(XBLOCK=1, R0_BLOCK=2048))
    kc._attach(again)
    assert [launcher.config.kwargs["R0_BLOCK"] for launcher in again.launchers] == [2048]  # nothing left to time
    assert kc.stats["served"] == 1 and not isinstance(again.save_cache_hook, kc._Keeper)


@pytest.fixture(scope="module")
def redis_url():
    from redis_server import RedisServer, require_redis

    require_redis()
    srv = RedisServer().start()
    yield srv.url(prefix="kernel-configs")
    srv.stop()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_second_machine_on_the_same_store_is_served_what_the_first_kept(kind, tmp_path, monkeypatch, request):
    """Two store objects on one location (a SQLite file, a Redis server): one machine keeps, the other serves."""
    from torch._inductor import config

    from gemmtune.store.locations import open_store

    location = str(tmp_path / "shared.sqlite") if kind == "sqlite" else request.getfixturevalue("redis_url")
    monkeypatch.setattr(kc, "_env", lambda: "E")
    first, second = open_store(location), open_store(location)
    try:
        kc.keep(lambda: first)
        kernel, _ = _kernel(_config(XBLOCK=1, R0_BLOCK=1024), _config(XBLOCK=1, R0_BLOCK=2048))
        kc._attach(kernel)
        kernel.save_cache_hook(kernel.launchers[0].config, 1000)
        kc.keep(lambda: second)
        seen = []
        kc._wrap_triton(lambda self, name, src: seen.append(dict(config.autotune_lookup_table)))(None, "k", MODULE)
        (table,) = seen
        assert list(table.values()) == [{"XBLOCK": 1, "R0_BLOCK": 1024, "num_warps": 8, "num_stages": 1,
                                         "found_by_coordesc": False}]
    finally:
        kc.keep(None)
        first.clear()
        for store in (first, second):
            store.close()


def test_a_descents_pick_is_kept_beside_a_timed_one_and_served_first(store):
    """A default-mode compile timed the kernel first; a max-autotune compile then descends from there."""
    timed, _ = _kernel(_config(XBLOCK=1, R0_BLOCK=1024), _config(XBLOCK=1, R0_BLOCK=2048))
    kc._attach(timed)
    timed.save_cache_hook(timed.launchers[1].config, 10)
    start, _ = _kernel(_config(XBLOCK=1, R0_BLOCK=2048), coordesc=True)
    kc._attach(start)
    found = _config(XBLOCK=1, R0_BLOCK=512)
    found.found_by_coordesc = True
    start.save_cache_hook(found, 20, found_by_coordesc=True)
    assert kc._stored(kc.lookup_hash(MODULE))["R0_BLOCK"] == 512 and kc.stats["kept"] == 2


def test_inductors_caches_switched_off_time_every_config_afresh(store):
    from torch._inductor import config

    kernel, _ = _kernel(_config(XBLOCK=1, R0_BLOCK=1024), _config(XBLOCK=1, R0_BLOCK=2048))
    kc._attach(kernel)
    kernel.save_cache_hook(kernel.launchers[1].config, 10)
    with config.patch(force_disable_caches=True):
        tables = []
        kc._wrap_triton(lambda self, name, src: tables.append(dict(config.autotune_lookup_table)))(None, "k", MODULE)
    assert tables == [{}] and kc.stats["served"] == 0
    again, _ = _kernel(_config(XBLOCK=1, R0_BLOCK=1024), _config(XBLOCK=1, R0_BLOCK=2048))
    again.inductor_meta["force_disable_caches"] = True
    kc._attach(again)
    assert len(again.launchers) == 2 and not isinstance(again.save_cache_hook, kc._Keeper)


GOOD_ENTRY = {"XBLOCK": 1, "R0_BLOCK": 2048, "num_warps": 8, "num_stages": 1, "found_by_coordesc": False}


@pytest.mark.parametrize("data", [
    b"[1, 2, 3]",
    b"{not json",
    json.dumps({**GOOD_ENTRY, "XBLOCK": 3}).encode(),  # not a power of two
    json.dumps({**GOOD_ENTRY, "R0_BLOCK": 1 << 30}).encode(),  # absurd
    json.dumps({**GOOD_ENTRY, "XBLOCK": 1024, "R0_BLOCK": 4096}).encode(),  # 4M elements in one block
    json.dumps({**GOOD_ENTRY, "num_warps": 3}).encode(),
    json.dumps({**GOOD_ENTRY, "num_stages": 0}).encode(),
    json.dumps({**GOOD_ENTRY, "XBLOCK": True}).encode(),
    json.dumps({**GOOD_ENTRY, "waves_per_eu": 2}).encode(),  # a key the table does not give back
    json.dumps({k: v for k, v in GOOD_ENTRY.items() if k != "num_warps"}).encode(),
    json.dumps({**GOOD_ENTRY, "found_by_coordesc": "yes"}).encode(),
    b" " * 4096 + json.dumps(GOOD_ENTRY).encode(),  # too large for a config
], ids=["list", "not_json", "block_3", "block_absurd", "too_many_elements", "warps_3", "stages_0", "bool_block",
        "unknown_key", "no_warps", "coordesc_text", "oversized"])
def test_a_malformed_stored_config_is_skipped_with_a_warning_naming_the_store_and_key(store, data, caplog):
    from torch._inductor import config

    key = kc._key(kc.lookup_hash(MODULE))
    store.put_kernel_files(key, {kc.FILE: data})
    tables = []
    compile_source = kc._wrap_triton(lambda self, name, src: tables.append(dict(config.autotune_lookup_table)))
    with caplog.at_level("WARNING", logger="gemmtune"), pytest.warns(RuntimeWarning, match="kernel config"):
        compile_source(None, "k", MODULE)
        compile_source(None, "k", MODULE)  # said and counted once
    assert tables == [{}, {}] and kc.stats["served"] == 0 and kc.stats["skipped"] == 1
    (line,) = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert key in line and store.path in line


def test_a_malformed_descent_entry_falls_back_to_the_timed_one(store):
    fn_hash = kc.lookup_hash(MODULE)
    store.put_kernel_files(kc._key(fn_hash, descended=True), {kc.FILE: b"[1, 2, 3]"})
    store.put_kernel_files(kc._key(fn_hash), {kc.FILE: json.dumps(GOOD_ENTRY).encode()})
    with pytest.warns(RuntimeWarning, match="not a JSON object"):
        assert kc._stored(fn_hash) == GOOD_ENTRY
