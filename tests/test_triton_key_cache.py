"""Triton's key for its own installation, kept across processes (templates/triton/key_cache.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from gemmtune.templates.triton import key_cache


def _tree(tmp_path):
    root = tmp_path / "triton"
    for rel in ("runtime/cache.py", "compiler/compiler.py", "backends/nvidia/driver.py", "language/core.py",
                "_C/libtriton.so"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    return root


def test_the_signature_changes_with_any_file_the_key_hashes_and_with_the_version(tmp_path):
    root = _tree(tmp_path)
    first = key_cache.signature(root, "3.6.0")
    assert key_cache.signature(root, "3.6.0") == first
    assert key_cache.signature(root, "3.6.1") != first
    seen = {first}
    for change in (lambda: (root / "_C/libtriton.so").write_text("rebuilt library"),
                   lambda: (root / "language/extra.py").write_text("x = 1"),
                   lambda: (root / "compiler/compiler.py").unlink(),
                   lambda: os.utime(root / "runtime/cache.py", ns=(1, 1))):
        change()
        seen.add(key_cache.signature(root, "3.6.0"))
    assert len(seen) == 5
    # Python's bytecode next to the sources is not part of it.
    (root / "language" / "core.pyc").write_text("bytecode")
    assert key_cache.signature(root, "3.6.0") in seen


def test_a_key_is_kept_under_its_signature_and_a_bad_file_is_a_miss(tmp_path):
    path = tmp_path / "d" / "triton_key.json"
    calls = []

    def compute():
        calls.append(1)
        return f"KEY{len(calls)}"

    assert key_cache.remembered("a", compute, path) == "KEY1"
    assert key_cache.remembered("a", compute, path) == "KEY1" and len(calls) == 1
    assert key_cache.remembered("b", compute, path) == "KEY2"
    assert json.loads(path.read_text()) == {"a": "KEY1", "b": "KEY2"}
    for n in range(key_cache.KEEP + 2):
        key_cache.remembered(f"s{n}", lambda: "K", path)
    assert len(json.loads(path.read_text())) == key_cache.KEEP
    path.write_text("{not json")
    assert key_cache.remembered("a", compute, path) == "KEY3"
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the directory should be: nothing can be kept, the key is given
    assert key_cache.remembered("a", lambda: "K", blocked / "triton_key.json") == "K"
    assert not list(tmp_path.glob("d/.triton_key.*"))


@pytest.fixture
def fresh(monkeypatch):
    """key_cache as in a new process; Triton's own function put back afterwards."""
    monkeypatch.setattr(key_cache, "_INSTALLED", [])
    monkeypatch.setattr(key_cache, "_ASKED", [])
    cache = pytest.importorskip("triton.runtime.cache")
    autotuner = pytest.importorskip("triton.runtime.autotuner")
    monkeypatch.setattr(cache, "triton_key", cache.triton_key)
    monkeypatch.setattr(autotuner, "triton_key", autotuner.triton_key)
    cache.triton_key.cache_clear()  # as in a process that has not hashed Triton yet
    return cache, autotuner


def test_triton_is_given_its_own_key_then_the_kept_one_without_hashing(fresh, tmp_path):
    cache, autotuner = fresh
    own = cache.triton_key
    assert key_cache.install(tmp_path) and key_cache.installed()
    assert cache.triton_key is not own and autotuner.triton_key is cache.triton_key
    assert cache.triton_key() == own()
    kept = json.loads((tmp_path / key_cache.FILE).read_text())
    assert list(kept.values()) == [own()]
    # The next process reads the file: a planted key under the same signature is what Triton gets.
    (tmp_path / key_cache.FILE).write_text(json.dumps({sig: "PLANTED" for sig in kept}))
    key_cache._INSTALLED.clear()
    cache.triton_key = autotuner.triton_key = own
    own.cache_clear()  # a new process
    assert key_cache.install(tmp_path)
    assert cache.triton_key() == "PLANTED" and autotuner.triton_key() == "PLANTED"
    assert key_cache.install(tmp_path)  # once per process


def test_a_triton_without_the_function_is_left_as_it_is(fresh, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", types.ModuleType("triton.runtime.cache"))
    monkeypatch.setattr(sys.modules["triton.runtime"], "cache", sys.modules["triton.runtime.cache"])
    assert key_cache.install(tmp_path) is False and not key_cache.installed()
    assert not (tmp_path / key_cache.FILE).exists()


def test_the_setting_turns_it_off_and_a_compile_turns_it_on(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMTUNE_TRITON_KEY_CACHE", "0")
    key_cache.ensure()
    assert not key_cache.installed()
    key_cache._ASKED.clear()
    monkeypatch.delenv("GEMMTUNE_TRITON_KEY_CACHE")
    key_cache.ensure()
    assert key_cache.installed()


def test_a_fresh_process_reads_the_kept_key(tmp_path):
    pytest.importorskip("triton.runtime.cache")
    code = ("import triton.runtime.cache as c; from gemmtune.templates.triton import key_cache as k; "
            "k.install(); print(c.triton_key() == PLANT)")
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", code.replace("PLANT", "None")], env=env, capture_output=True,
                           text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    kept = json.loads((tmp_path / key_cache.FILE).read_text())
    (tmp_path / key_cache.FILE).write_text(json.dumps({sig: "PLANTED" for sig in kept}))
    second = subprocess.run([sys.executable, "-c", code.replace("PLANT", "'PLANTED'")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and second.stdout.strip() == "True", second.stderr


def test_a_key_triton_computed_before_is_served_but_not_written(fresh, tmp_path):
    cache, _ = fresh
    own = cache.triton_key
    own.cache_clear()
    computed = own()  # this process hashed Triton before gemmtune's first compile
    assert key_cache.install(tmp_path)
    assert cache.triton_key() == computed
    assert not (tmp_path / key_cache.FILE).exists()


def test_files_that_change_while_triton_hashes_them_are_not_vouched_for(tmp_path):
    path = tmp_path / "triton_key.json"
    assert key_cache.remembered("before", lambda: "KEY", path, again=lambda: "after") == "KEY"
    assert not path.exists()
    assert key_cache.remembered("same", lambda: "KEY", path, again=lambda: "same") == "KEY" and path.exists()


def test_linked_folders_are_part_of_the_signature(tmp_path):
    """An editable Triton links backends/nvidia into its sources: a change there changes the signature."""
    root = _tree(tmp_path)
    elsewhere = tmp_path / "third_party" / "nvidia"
    elsewhere.mkdir(parents=True)
    (elsewhere / "compiler.py").write_text("codegen")
    (root / "backends" / "nvidia_linked").symlink_to(elsewhere, target_is_directory=True)
    (root / "backends" / "again").symlink_to(root / "backends", target_is_directory=True)  # a cycle, read once
    first = key_cache.signature(root, "3.6.0")
    (elsewhere / "compiler.py").write_text("other codegen")
    assert key_cache.signature(root, "3.6.0") != first


def test_a_module_that_imported_the_function_by_name_is_given_the_kept_one(fresh, monkeypatch, tmp_path):
    cache, _ = fresh
    holder = types.ModuleType("inductor_like")
    holder.triton_key = cache.triton_key
    monkeypatch.setitem(sys.modules, "inductor_like", holder)
    assert key_cache.install(tmp_path)
    assert holder.triton_key is cache.triton_key


def test_a_new_machine_reads_the_key_from_a_shared_store_instead_of_hashing(fresh, tmp_path):
    from gemmtune.store import kernels
    from gemmtune.store.signing import Signer
    from gemmtune.store.sqlite import Store
    from gemmtune.store.trust import Trust
    from gemmtune.templates.triton import wheel_key

    cache, autotuner = fresh
    own = cache.triton_key
    root = os.path.dirname(os.path.dirname(cache.__file__))
    if wheel_key.signature(root, __import__("triton").__version__) is None:
        pytest.skip("this Triton's files are not all vouched for by its wheel's RECORD")
    store = Store(tmp_path / "store.db", trust=Trust(Signer.from_text("a-fleet-secret-of-32-characters!")))
    try:
        assert kernels.share(store)  # kernels (and Triton's key) are shared only under a key
        assert key_cache.install(tmp_path / "machine1") and cache.triton_key() == own()  # hashed, then offered
        kernels.publish(store, [])
        # Machine 2: nothing in its own cache directory; Triton's own function is not called.
        key_cache._INSTALLED.clear()
        cache.triton_key = autotuner.triton_key = own
        own.cache_clear()
        hashed = []
        counting = lambda: hashed.append(1) or "HASHED"  # noqa: E731
        counting.cache_info = own.cache_info  # type: ignore[attr-defined]
        cache.triton_key = autotuner.triton_key = counting
        assert key_cache.install(tmp_path / "machine2")
        assert cache.triton_key() == own() and hashed == []
        assert list(json.loads((tmp_path / "machine2" / key_cache.FILE).read_text()).values()) == [own()]
    finally:
        kernels.stop_sharing()
