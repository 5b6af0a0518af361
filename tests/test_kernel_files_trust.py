"""Kernel files in a store read as untrusted input (store/kernel_entries.py): signed under the store's
key, size-bounded before anything is loaded, on a real SQLite file and a real redis-server."""

from __future__ import annotations

import base64
import tracemalloc

import pytest

from gemmtune.store import kernel_entries
from gemmtune.store.locations import open_store
from gemmtune.store.signing import Signer
from gemmtune.store.trust import Trust
from redis_server import fresh_location, server  # noqa: F401 - server: a fixture

KEY = "a-fleet-secret-of-32-characters!"
TRUST = Trust(Signer.from_text(KEY))
HOSTILE = Trust(Signer.from_text("a-guess-at-the-fleets-secret-000"))


@pytest.fixture(params=["sqlite", "redis"])
def location(request, tmp_path):
    """One store location, as every machine of a fleet names it."""
    return fresh_location(request, tmp_path, request.param, "t")


@pytest.fixture(autouse=True)
def _said_anew(monkeypatch):
    monkeypatch.setattr(kernel_entries, "_SAID", set())


@pytest.mark.parametrize("writer", [None, HOSTILE], ids=["unsigned", "forged"])
def test_a_file_that_does_not_verify_under_the_key_is_not_read_and_a_writer_with_the_key_replaces_it(
        location, writer, caplog):
    planted = open_store(location, writer or Trust())  # a writer without the fleet's key
    planted.put_kernel_files("KERNEL", {"k.so": b"\x7fELF planted"})
    reader = open_store(location, TRUST)
    with caplog.at_level("WARNING", logger="gemmtune"), pytest.warns(RuntimeWarning, match="unsigned or badly signed"):
        assert reader.kernel_files("KERNEL") == {}
        assert not reader.has_kernel_files("KERNEL")
    (line,) = [r.getMessage() for r in caplog.records if "KERNEL" in r.getMessage()]
    assert reader.path in line and "k.so" in line
    reader.put_kernel_files("KERNEL", {"k.so": b"\x7fELF built by the fleet"})
    assert open_store(location, TRUST).kernel_files("KERNEL") == {"k.so": b"\x7fELF built by the fleet"}
    assert reader.has_kernel_files("KERNEL")
    reader.put_kernel_files("KERNEL", {"k.so": b"\x7fELF a later build"})  # a verified file stays: first writer wins
    assert reader.kernel_files("KERNEL") == {"k.so": b"\x7fELF built by the fleet"}


def test_a_signed_file_copied_under_another_key_does_not_verify(location):
    store = open_store(location, TRUST)
    store.put_kernel_files("NATIVE_A", {"mod.so": b"module a"})
    copied = open_store(location, Trust()).kernel_files("NATIVE_A")  # what a reader without the key sees...
    assert copied == {"mod.so": b"module a"}
    raw = _raw_entries(store, "NATIVE_A")  # ...and the signature beside it, copied too by a hostile writer
    _plant(store, "NATIVE_B", raw)
    with pytest.warns(RuntimeWarning, match="NATIVE_B"):
        assert store.kernel_files("NATIVE_B") == {}
    assert store.kernel_files("NATIVE_A") == {"mod.so": b"module a"}


def test_a_file_over_the_bound_is_never_loaded_and_the_rest_is_read(location, monkeypatch):
    monkeypatch.setattr(kernel_entries, "MAX_FILE_BYTES", 4 << 20)  # the bound, smaller: a quicker test
    store = open_store(location, Trust())
    store.put_kernel_files("KERNEL", {"k.json": b"{}"})
    _plant(store, "KERNEL", {"k.cubin": b"\0" * (8 << 20)})
    tracemalloc.start()
    try:
        with pytest.warns(RuntimeWarning, match="over"):
            files = store.kernel_files("KERNEL")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert files == {"k.json": b"{}"}
    assert peak < kernel_entries.MAX_FILE_BYTES // 4, f"{peak} bytes held while reading"


def _raw_entries(store, key: str) -> dict[str, bytes]:
    if hasattr(store, "_db"):
        return {n: bytes(d) for n, d in store._db.execute("SELECT name, data FROM kernel_files WHERE key=?", (key,))}
    return {n: base64.b64decode(v) for n, v in store._client.hgetall(f"{store.prefix}:kernel:{key}").items()}


def _plant(store, key: str, entries: dict[str, bytes]) -> None:
    """Entries written straight into the store, as a hostile writer with access to it would."""
    if hasattr(store, "_db"):
        with store._tx() as db:
            db.executemany("INSERT OR REPLACE INTO kernel_files VALUES (?, ?, ?, 0)",
                           [(key, n, d) for n, d in entries.items()])
        return
    import redis

    client = redis.Redis(port=store._client.connection_pool.connection_kwargs["port"], socket_timeout=30)
    client.hset(f"{store.prefix}:kernel:{key}", mapping={n: base64.b64encode(d) for n, d in entries.items()})
    client.close()
