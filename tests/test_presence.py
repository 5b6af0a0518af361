"""The hold a process keeps on a SQLite store (`store.presence`): released when its last Store is gone,
never waiting on its own lock when the garbage collector releases it inside `join`."""

from __future__ import annotations

import threading

from gemmtune.store import presence
from gemmtune.store.presence import Presence


class _Owner:
    """Something a hold is kept for (a Store, in gemmtune)."""


def test_a_release_from_the_garbage_collector_inside_join_never_waits_for_the_lock(tmp_path):
    path = str(tmp_path / "s.sqlite")
    owner = _Owner()
    held = Presence.join(path, timeout_s=1.0, owner=owner)
    assert held is not None and held.owners == 1

    def released_inside_join() -> None:  # what a collection inside `join` does: this thread holds the guard
        with presence._GUARD:
            held._release()

    worker = threading.Thread(target=released_inside_join, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "a release made while the guard is held waited for it (a deadlock)"
    assert held.owners == 1  # queued: made by the next join
    again = Presence.join(path, timeout_s=1.0)
    assert again is not held and (held.owners, again.owners) == (0, 0)  # the old hold was closed, a new one taken


def test_a_hold_is_kept_while_a_store_lives_and_released_when_the_last_goes(tmp_path):
    path = str(tmp_path / "s.sqlite")
    first, second = _Owner(), _Owner()
    held = Presence.join(path, timeout_s=1.0, owner=first)
    assert Presence.join(path, timeout_s=1.0, owner=second) is held and held.owners == 2
    del first
    assert Presence.join(path, timeout_s=1.0) is held and held.owners == 1
    del second
    assert Presence.join(path, timeout_s=1.0) is not held
