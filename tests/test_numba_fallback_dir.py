"""Where numba_mm's kernels (and Numba's pickled cache of them) go when the cache directory is not
writable (templates/numba_load.py): `$TMPDIR/gemmtune-<uid>/numba` only where no one else can write it."""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from gemmtune.templates import numba_load

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    """$TMPDIR for this test, and a process that has made no private directory yet."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.setattr(numba_load, "_FRESH", [])
    return root


def _load(tmp_path: Path):
    """A kernel module loaded with a cache directory that cannot be written (below a plain file: not
    even root can make it)."""
    (tmp_path / "a-file").write_text("not a directory")
    stem = f"fallback_{uuid.uuid4().hex[:8]}"
    mod = numba_load.load_module(stem, lambda: "X = 1\n", tmp_path / "a-file" / "numba")
    sys.modules.pop(mod.__name__, None)
    numba_load._MODULES.pop(stem, None)
    return mod


@pytest.mark.parametrize("plant", ["numba_0777", "parent_0777", "numba_a_link"])
def test_a_fallback_directory_others_could_write_is_not_used(tmp_path, tmp_root, plant, caplog):
    shared = tmp_root / f"gemmtune-{os.getuid()}"
    shared.mkdir(mode=0o700)
    target = shared / "numba"
    if plant == "numba_a_link":
        target = tmp_path / "someone-elses"
        target.mkdir(mode=0o700)
        (shared / "numba").symlink_to(target)
    else:
        target.mkdir(mode=0o700)
        os.chmod(shared if plant == "parent_0777" else target, 0o777)
    with caplog.at_level("WARNING", logger="gemmtune"):
        mod = _load(tmp_path)
        again = _load(tmp_path)
    assert mod.X == 1 and list(target.iterdir()) == []  # nothing written where another user could have seeded it
    used = Path(mod.__file__).parent
    assert used == Path(again.__file__).parent  # one private directory per process
    assert not used.is_symlink() and used.stat().st_uid == os.getuid() and used.stat().st_mode & 0o777 == 0o700
    (line,) = [r.getMessage() for r in caplog.records if "numba_mm" in r.getMessage()]
    assert str(shared / "numba") in line and str(used) in line


def test_a_private_fallback_directory_is_used_and_a_new_one_made_private(tmp_path, tmp_root, caplog):
    with caplog.at_level("WARNING", logger="gemmtune"):
        mod = _load(tmp_path)
    shared = tmp_root / f"gemmtune-{os.getuid()}" / "numba"
    assert Path(mod.__file__).parent == shared and not caplog.records
    assert all(p.stat().st_mode & 0o777 == 0o700 for p in (shared, shared.parent))


def test_an_older_fallback_directory_only_this_user_could_write_is_made_private_and_used(tmp_path, tmp_root):
    shared = tmp_root / f"gemmtune-{os.getuid()}"
    (shared / "numba").mkdir(parents=True)
    for path in (shared, shared / "numba"):
        os.chmod(path, 0o755)  # as an older gemmtune made it
    assert Path(_load(tmp_path).__file__).parent == shared / "numba"
    assert (shared / "numba").stat().st_mode & 0o777 == 0o700
