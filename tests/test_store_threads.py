"""The SQLite store used by several threads at once, as a tune uses it: compile threads read kernels
(`kernel_files`, through Triton's cache manager) while the tuning thread writes picks and kernels.
They share one connection, and an SQLite built in multi-thread mode (not serialized) refuses a
connection used by two threads at once ("bad parameter or other API misuse"), so the store runs one
statement at a time.  The connection below records how many threads are inside it at once."""

from __future__ import annotations

import threading
import time

from gemmtune.store.rows import Row
from gemmtune.store.sqlite import Store

ROUNDS = 60


class Watched:
    """A connection that counts the threads inside `execute` at once (each call held for 0.2 ms)."""

    def __init__(self, db):
        self._db, self._lock, self.inside, self.most = db, threading.Lock(), 0, 0

    def _enter(self) -> None:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)

    def _leave(self) -> None:
        with self._lock:
            self.inside -= 1

    def execute(self, *args):
        self._enter()
        try:
            time.sleep(0.0002)
            return self._db.execute(*args)
        finally:
            self._leave()

    def executemany(self, *args):
        self._enter()
        try:
            return self._db.executemany(*args)
        finally:
            self._leave()

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_threads_reading_and_writing_at_once_take_turns_on_the_connection(tmp_path):
    store = Store(tmp_path / "store.db")
    store.put_kernel_files("K0", {"a.json": b"{}", "a.cubin": b"x" * 4096})
    watched = store._db = Watched(store._db)
    errors: list[BaseException] = []
    partial: list[dict] = []

    def writer() -> None:
        try:
            for i in range(ROUNDS):
                pick = Row("aten_mm", None, "{}", "{}", float(i + 1), "ok")
                store.save("env", {}, f"p{i}", f"p{i}", [pick], pick, replace_pick=True)
                store.put_kernel_files(f"K{i + 1}", {"a.json": b"{}", "a.cubin": b"y" * 4096})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for i in range(ROUNDS):
                files = store.kernel_files(f"K{i % 5}")
                if files and set(files) != {"a.json", "a.cubin"}:
                    partial.append(files)
                store.has_kernel_files("K0")
                store.load("env", f"p{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and partial == []
    assert watched.most == 1  # never two threads on the connection at once
    assert store.load("env", f"p{ROUNDS - 1}").pick.ms == float(ROUNDS)
    assert len(store.kernel_files(f"K{ROUNDS}")) == 2
