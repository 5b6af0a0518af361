"""Compiled kernels in the store (`share_kernels`, `gemmtune.store.kernels`): Triton's own compile and
native-module build, on this CPU, against a second Triton cache that stands for a new machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest
import torch

import gemmtune
from gemmtune.core.settings import Settings
from gemmtune.store import kernels
from gemmtune.store.locations import open_store
from gemmtune.store.signing import Signer
from gemmtune.store.sqlite import Store
from gemmtune.store.trust import Trust
from gemmtune.templates.binaries import BinaryFiles, report
from helpers import ScriptedTemplate
from redis_server import RedisServer, require_redis

triton = pytest.importorskip("triton")
from triton import knobs  # noqa: E402

KEY = "a-fleet-secret-of-32-characters!"  # the fleet's store_key
TRUST = Trust(Signer.from_text(KEY))

# One "machine": a fresh process (Triton's interpreter, which other tests run, patches triton.language
# for the whole process) compiling a kernel for sm_90 into the Triton cache CACHE, which Triton does on
# a CPU machine (its ptxas ships in the wheel).  It prints the compile's cache hits, the cubin's digest,
# whether every file of the kernel is under CACHE, and how many binaries `publish` wrote.
MACHINE = """
import hashlib, json, os, sys
from pathlib import Path
import triton, triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction
from gemmtune.store import kernels
from gemmtune.store.signing import Signer
from gemmtune.store.sqlite import Store
from gemmtune.store.trust import Trust
from gemmtune.templates.binaries import BinaryFiles

def double(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

cache, store_path, share, publish = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
os.environ["TRITON_CACHE_DIR"] = cache
store = Store(store_path, trust=Trust(Signer.from_text(os.environ["GEMMTUNE_STORE_KEY"])))
if share:
    assert kernels.share(store)
hits = []
knobs.compilation.listener = lambda **info: hits.append(info["cache_hit"])
src = triton.compiler.ASTSource(fn=JITFunction(double), signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                constexprs={"BLOCK": 64})
with kernels.scope():  # one of gemmtune's compiles
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
group = kernel.metadata_group
files = BinaryFiles(Path(next(iter(group.values()))).parent.name, dict(group))
print(json.dumps(dict(hits=hits, cubin=hashlib.sha256(kernel.asm["cubin"]).hexdigest(), key=files.key,
                      local=all(Path(p).resolve().is_relative_to(Path(cache).resolve()) for p in group.values()),
                      published=kernels.publish(store, [files]) if publish else None)))
"""


@pytest.fixture(autouse=True)
def _not_shared(monkeypatch):
    kernels.stop_sharing()
    monkeypatch.setattr(kernels, "_SAID", set())  # each test is a new process for what is said once
    yield
    kernels.stop_sharing()


def _machine(tmp_path: Path, name: str, share: bool, publish: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["GEMMTUNE_STORE_KEY"] = KEY
    script = tmp_path / "machine.py"  # a file: Triton reads a kernel's source from it
    script.write_text(MACHINE)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / name), str(tmp_path / "store.sqlite"),
                           "1" if share else "0", "1" if publish else "0"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_kernel_published_on_one_machine_is_loaded_from_the_store_on_another(tmp_path):
    built = _machine(tmp_path, "machine-a", share=True, publish=True)
    assert built["hits"] == [False] and built["published"] == 1  # compiled, then kept in the store
    loaded = _machine(tmp_path, "machine-b", share=True, publish=True)  # a new machine: its Triton cache is empty
    assert loaded["hits"] == [True]
    assert loaded["cubin"] == built["cubin"] and loaded["local"]  # the same binary, in machine-b's own cache
    assert loaded["published"] == 0  # served by the store: not read and written again


def test_without_sharing_a_new_triton_cache_compiles_again(tmp_path):
    _machine(tmp_path, "machine-a", share=True, publish=True)
    assert _machine(tmp_path, "machine-b", share=False)["hits"] == [False]


def test_a_kernel_missing_a_file_in_the_store_is_compiled(tmp_path):
    _machine(tmp_path, "machine-a", share=True, publish=True)
    store = Store(tmp_path / "store.sqlite", trust=TRUST)
    with store._tx() as db:  # the group names a file the store no longer holds: a miss, not a broken kernel
        db.execute("DELETE FROM kernel_files WHERE name LIKE '%.cubin'")
    assert _machine(tmp_path, "machine-b", share=True)["hits"] == [False]


def test_a_stored_group_naming_a_path_outside_the_cache_is_refused_and_compiled(tmp_path):
    built = _machine(tmp_path, "machine-a", share=True, publish=True)
    store = Store(tmp_path / "store.sqlite", trust=TRUST)  # a writer with the key: the entry is signed
    files = store.kernel_files(built["key"])
    grp = next(n for n in files if n.startswith(kernels.GROUP))
    names = json.loads(files[grp])
    store.clear()
    store.put_kernel_files(built["key"], {**files, "../../evil.txt": b"x",
                                          grp: json.dumps([*names, "../../evil.txt"]).encode()})
    assert _machine(tmp_path, "machine-b", share=True)["hits"] == [False]  # the poisoned entry was not served
    assert not list(tmp_path.rglob("evil.txt"))


def _native_src(name: str) -> str:
    return (f'#include <Python.h>\nstatic PyObject* answer(PyObject* s, PyObject* a) {{ return PyLong_FromLong(42); }}\n'
            f'static PyMethodDef m[] = {{{{"answer", answer, METH_NOARGS, ""}}, {{NULL, NULL, 0, NULL}}}};\n'
            f'static struct PyModuleDef d = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, m}};\n'
            f'PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&d); }}\n')


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.skipif(not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists(), reason="no Python headers")
def test_a_native_module_triton_builds_is_kept_and_loaded_without_a_compiler(tmp_path, monkeypatch):
    from triton.runtime import build

    name = f"gemmtune_test_{uuid.uuid4().hex[:8]}"
    store = Store(tmp_path / "store.sqlite", trust=TRUST)
    assert kernels.share(store)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "machine-a"))
    with kernels.scope():
        assert build.compile_module_from_src(_native_src(name), name).answer() == 42
    kernels.publish(store, [])  # native modules are written by the tuning thread's next publish
    assert any(store.kernel_files(k.name) for k in (tmp_path / "machine-a").iterdir())

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "machine-b"))
    monkeypatch.setattr(build, "_build", lambda *a, **k: pytest.fail("the C compiler ran on the new machine"))
    with kernels.scope():
        assert build.compile_module_from_src(_native_src(name), name).answer() == 42


class _Reporting(ScriptedTemplate):
    """A scripted template whose binaries have files in a compiler cache, as a Triton template's do."""

    def __init__(self, root: Path):
        super().__init__(uid="reporting", runtime=(1,))
        self.root = root

    def compile(self, choice, ki, example):
        tile = choice.config_dict["TILE"]
        key = f"KEY{tile}"
        (self.root / key).mkdir(parents=True, exist_ok=True)
        files = {}
        for ext in ("json", "cubin"):
            path = self.root / key / f"k{tile}.{ext}"
            path.write_bytes(f"{ext} of tile {tile}".encode())
            files[path.name] = str(path)
        report(BinaryFiles(key, files))
        return super().compile(choice, ki, example)


@pytest.mark.parametrize("share", [True, False], ids=["shared", "not_shared"])
def test_a_tune_keeps_only_its_picks_kernels_in_the_store(tmp_path, share):
    location = str(tmp_path / "store.sqlite")
    template = _Reporting(tmp_path / "cache")
    a, b = torch.randn(16, 8), torch.randn(8, 4)
    sel = gemmtune.tune("mm", a, b, templates=[template], strategy="exhaustive",
                        settings=Settings(share_kernels=share, store=location, store_key=KEY))
    picked = f"KEY{sel.winner.config_dict['TILE']}"
    store = open_store(location, TRUST)
    kept = {key: store.kernel_files(key) for key in ("KEY8", "KEY16")}
    if not share:
        assert kept == {"KEY8": {}, "KEY16": {}}
        return
    tile = sel.winner.config_dict["TILE"]
    assert kept[picked] == {f"k{tile}.json": f"json of tile {tile}".encode(),
                            f"k{tile}.cubin": f"cubin of tile {tile}".encode(),
                            f"{kernels.GROUP}k{tile}.json": f'["k{tile}.cubin", "k{tile}.json"]'.encode()}
    assert [k for k, files in kept.items() if files] == [picked]  # the other candidate stays out


def test_another_cache_manager_is_left_in_place(monkeypatch):
    class Mine(kernels.StoreCacheManager):
        pass

    monkeypatch.setattr(knobs.cache, "manager_class", Mine)
    assert not kernels.share(Store(":memory:", trust=TRUST))
    assert knobs.cache.manager_class is Mine


def test_the_store_keeps_the_first_copy_of_a_file_and_clear_removes_them(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.put_kernel_files("K", {"a.cubin": b"one"})
    store.put_kernel_files("K", {"a.cubin": b"two", "a.json": b"{}"})
    assert store.kernel_files("K") == {"a.cubin": b"one", "a.json": b"{}"}
    store.clear()
    assert store.kernel_files("K") == {}


@pytest.fixture(scope="module")
def redis_url():
    require_redis()
    srv = RedisServer().start()
    yield srv.url(prefix=f"k{os.getpid()}")
    srv.stop()


def test_a_redis_store_keeps_binary_files_and_a_down_server_is_a_miss(redis_url):
    store = open_store(redis_url)
    data = bytes(range(256)) * 3
    store.put_kernel_files("K", {"k.cubin": data})
    store.put_kernel_files("K", {"k.cubin": b"later"})
    assert store.kernel_files("K") == {"k.cubin": data}
    assert store.has_kernel_files("K") and not store.has_kernel_files("none")
    down = open_store("redis://127.0.0.1:1/0?timeout=0.05")
    with pytest.warns(RuntimeWarning, match="did not answer"):
        assert down.kernel_files("K") == {}
    assert not down.has_kernel_files("K")
    down.put_kernel_files("K", {"k.cubin": data})  # not kept, and no error


GOOD = {"k.json": b'{"name": "k"}', "k.cubin": b"binary", kernels.GROUP + "k.json": b'["k.cubin", "k.json"]'}


@pytest.mark.parametrize("entry", [
    {**GOOD, kernels.GROUP + "k.json": b"5"},  # a group that is not a list
    {**GOOD, "k\0.cubin": b"x", kernels.GROUP + "k.json": b'["k\\u0000.cubin", "k.json"]'},  # a NUL
    {**GOOD, "k" * 300: b"x", kernels.GROUP + "k.json": json.dumps(["k" * 300, "k.json"]).encode()},  # too long
    {**GOOD, "k.json": b"garbage"},  # metadata Triton could never read: written whole, it would never be rebuilt
    {**GOOD, "k.json": b"[1, 2]"},
], ids=["not_a_list", "nul", "long_name", "bad_metadata", "metadata_not_an_object"])
def test_a_malformed_stored_kernel_is_a_cache_miss_never_an_error(tmp_path, monkeypatch, entry):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    store = Store(":memory:", trust=TRUST)
    store.put_kernel_files("KEY", entry)
    assert kernels.share(store)
    with kernels.scope():
        manager = kernels.StoreCacheManager("KEY")
    assert manager.get_group("k.json") is None
    assert manager.get_file("k" * 300) is None
    assert sorted(p.name for p in (tmp_path / "cache" / "KEY").iterdir() if not p.name.startswith(".")) in (
        [], ["lock"])  # nothing of the entry written into the local cache


def test_a_whole_stored_kernel_is_served_and_the_override_and_dump_caches_stay_local(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_OVERRIDE_DIR", str(tmp_path / "override"))
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    store = Store(":memory:", trust=TRUST)
    store.put_kernel_files("KEY", GOOD)
    asked = []
    real = store.kernel_files
    monkeypatch.setattr(store, "kernel_files", lambda key: asked.append(key) or real(key))
    assert kernels.share(store)
    with kernels.scope():
        for flags in (dict(override=True), dict(dump=True)):
            assert kernels.StoreCacheManager("KEY", **flags).get_group("k.json") is None
        assert asked == []
        served = kernels.StoreCacheManager("KEY").get_group("k.json")
    assert asked == ["KEY"] and sorted(served) == ["k.cubin", "k.json"]
    assert Path(served["k.cubin"]).read_bytes() == b"binary"


def test_a_kernel_the_store_holds_already_is_not_sent_again(tmp_path):
    store = Store(":memory:", trust=TRUST)
    path = tmp_path / "k.cubin"
    path.write_bytes(b"binary")
    (tmp_path / "k.json").write_text("{}")
    binary = BinaryFiles("KEY", {"k.cubin": str(path), "k.json": str(tmp_path / "k.json")})
    assert kernels.publish(store, [binary]) == 1
    kernels.stop_sharing()  # a new process: it found the kernel in its own Triton cache
    sent = []
    real = store.put_kernel_files
    store.put_kernel_files = lambda key, files: sent.append(key) or real(key, files)
    assert store.has_kernel_files("KEY") and not store.has_kernel_files("OTHER")
    assert kernels.publish(store, [binary]) == 0 and sent == []


def test_a_tune_without_share_kernels_stops_sharing(tmp_path):
    store = Store(":memory:", trust=TRUST)
    kernels.sharing(store)
    with kernels.scope():
        assert knobs.cache.manager_class is kernels.StoreCacheManager
    kernels.sharing(None)
    with kernels.scope():
        assert knobs.cache.manager_class is not kernels.StoreCacheManager
    assert os.environ.get("TRITON_CACHE_MANAGER") is None
    a, b = torch.randn(16, 8), torch.randn(8, 4)
    kernels.sharing(store)
    gemmtune.tune("mm", a, b, backends=("extern",), settings=Settings(share_kernels=False, store="memory"))
    with kernels.scope():
        assert knobs.cache.manager_class is not kernels.StoreCacheManager


# -- no foreign code: a key, signed entries, the manager scoped, bounded files -----------------------

HOSTILE = Trust(Signer.from_text("a-guess-at-the-fleets-secret-000"))
NATIVE = sysconfig.get_config_var("EXT_SUFFIX")
CONSTRUCTOR = ('#include <stdio.h>\n#include <stdlib.h>\n'
               '__attribute__((constructor)) static void planted(void) {\n'
               '  const char* mark = getenv("GEMMTUNE_TEST_PLANTED_MARK");\n'
               '  FILE* f = mark ? fopen(mark, "w") : NULL;\n'
               '  if (f) fclose(f);\n}\n')


def test_without_a_store_key_no_kernel_is_served_or_kept_and_that_is_said_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    store = Store(tmp_path / "store.sqlite")  # no key: anyone who can write the file could plant code
    store.put_kernel_files("KEY", GOOD)
    (tmp_path / "k.cubin").write_bytes(b"binary")
    (tmp_path / "k.json").write_text("{}")
    binary = BinaryFiles("OURS", {"k.cubin": str(tmp_path / "k.cubin"), "k.json": str(tmp_path / "k.json")})
    with caplog.at_level("WARNING", logger="gemmtune"), pytest.warns(RuntimeWarning, match="needs store_key"):
        assert not kernels.share(store)
        kernels.sharing(store)
        with kernels.scope():
            assert kernels.StoreCacheManager("KEY").get_group("k.json") is None
        assert kernels.publish(store, [binary]) == 0
    assert store.kernel_files("OURS") == {}
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "share_kernels needs store_key" in caplog.records[0].getMessage() and len(caplog.records) == 1
    assert not list((tmp_path / "cache").rglob("k.cubin"))


def _native_key(tmp_path: Path, monkeypatch, name: str) -> str:
    """Triton's cache key of the native module `name` (its C source and the platform): built once in a
    scratch cache, as the machine that planted it could compute it."""
    from triton.runtime import build

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "scratch"))
    build.compile_module_from_src(_native_src(name), name)
    (key,) = [p.name for p in (tmp_path / "scratch").iterdir()]
    return key


def _planted_module(tmp_path: Path, name: str) -> bytes:
    """A module of that name whose load has a side effect: its constructor creates the mark file."""
    src = tmp_path / "planted.c"
    src.write_text(CONSTRUCTOR + _native_src(name))
    out = tmp_path / f"planted{NATIVE}"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(out)],
                   check=True, capture_output=True)
    return out.read_bytes()


@pytest.mark.parametrize("writer, reader, loaded", [
    (Trust(), Trust(), False),  # no key anywhere: nothing is served
    (Trust(), TRUST, False),  # a writer without the key
    (HOSTILE, TRUST, False),  # a signature under a guessed key
    (TRUST, TRUST, True),  # the fleet's own entry: served (and the mark shows that a load would be seen)
], ids=["no_key", "unsigned", "forged", "signed_by_the_fleet"])
def test_a_native_module_planted_in_the_store_is_never_loaded(tmp_path, monkeypatch, writer, reader, loaded):
    if shutil.which("gcc") is None or not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no C compiler or Python headers")
    from triton.runtime import build

    name = f"gemmtune_planted_{uuid.uuid4().hex[:8]}"
    key, planted = _native_key(tmp_path, monkeypatch, name), _planted_module(tmp_path, name)
    mark = tmp_path / "constructor-ran"
    monkeypatch.setenv("GEMMTUNE_TEST_PLANTED_MARK", str(mark))
    Store(tmp_path / "store.sqlite", trust=writer).put_kernel_files(key, {name + NATIVE: planted})
    kernels.sharing(Store(tmp_path / "store.sqlite", trust=reader))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "machine"))
    with kernels.scope():
        assert build.compile_module_from_src(_native_src(name), name).answer() == 42
    on_disk = [p for p in (tmp_path / "machine").rglob("*") if p.is_file() and p.read_bytes() == planted]
    assert (mark.exists(), bool(on_disk)) == (loaded, loaded)


class _Probe(ScriptedTemplate):
    """A template whose compile asks Triton for a cache manager in its compile thread, and in a thread
    of its own meanwhile (the user's code, compiling at the same time)."""

    def __init__(self):
        super().__init__(uid="probe", runtime=(1,))
        self.seen: list[tuple[str, str, bool]] = []

    def compile(self, choice, ki, example):
        import threading

        from triton.runtime.cache import get_cache_manager

        def ask(where: str) -> None:
            manager = get_cache_manager("0" * 64)  # a kernel's hash
            self.seen.append((where, type(manager).__name__, bool(getattr(manager, "shared", False))))

        ask("compile thread")
        other = threading.Thread(target=ask, args=("another thread",))
        other.start()
        other.join()
        return super().compile(choice, ki, example)


def test_the_store_serves_only_gemmtunes_compiles_and_tritons_manager_is_put_back_after_a_tune(tmp_path, monkeypatch):
    from triton.runtime.cache import get_cache_manager

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    before = knobs.cache.manager_class
    probe = _Probe()
    gemmtune.tune("mm", torch.randn(16, 8), torch.randn(8, 4), templates=[probe], strategy="exhaustive",
                  settings=Settings(share_kernels=True, store=str(tmp_path / "s.sqlite"), store_key=KEY))
    assert knobs.cache.manager_class is before and os.environ.get("TRITON_CACHE_MANAGER") is None
    assert type(get_cache_manager("1" * 64)).__name__ == "FileCacheManager"  # the user's next compile
    assert {s for s in probe.seen if s[0] == "compile thread"} == {("compile thread", "StoreCacheManager", True)}
    assert {s[2] for s in probe.seen if s[0] == "another thread"} == {False}  # Triton's own cache there


def test_a_stored_kernel_over_the_bounds_is_a_cache_miss_and_never_written(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "MAX_KERNEL_BYTES", 16)  # GOOD's files weigh more together
    store = Store(":memory:", trust=TRUST)
    store.put_kernel_files("KEY", GOOD)
    assert kernels.share(store)
    with caplog.at_level("WARNING", logger="gemmtune"), kernels.scope():
        assert kernels.StoreCacheManager("KEY").get_group("k.json") is None
    assert "over the bounds" in caplog.text
    assert not [p for p in (tmp_path / "cache").rglob("k.*")]


@pytest.mark.parametrize("share", [True, False], ids=["share_kernels", "not"])
def test_a_tune_of_no_store_keeps_the_process_sharing_and_keeps_nothing(tmp_path, monkeypatch, share):
    # The M-bucket builds tune with store="off": the store this process shares stays the one Triton's misses
    # are served from, and the build's kernel goes to no throwaway store.
    location = str(tmp_path / "store.sqlite")
    shared = open_store(location, TRUST)
    published: list = []
    monkeypatch.setattr(kernels, "publish", lambda store, binaries: published.append(store) or 0)
    assert kernels.share(shared)
    try:
        template = _Reporting(tmp_path / "cache")
        sel = gemmtune.tune("mm", torch.randn(16, 8), torch.randn(8, 4), templates=[template], strategy="exhaustive",
                            settings=Settings(share_kernels=share, store="off", store_key=KEY))
        assert kernels._STATE["store"] is shared
        with kernels.scope():
            assert knobs.cache.manager_class is kernels.StoreCacheManager
        assert not shared.has_kernel_files(f"KEY{sel.winner.config_dict['TILE']}") and published == []
    finally:
        kernels.stop_sharing()
