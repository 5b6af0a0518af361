"""Triton's key of its installation shared among machines with the same Triton wheel
(templates/triton/wheel_key.py), and kept in the store where kernels are shared (store/kernels.py)."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pytest

from gemmtune.store import kernels
from gemmtune.store.signing import Signer
from gemmtune.store.sqlite import Store
from gemmtune.store.trust import Trust
from gemmtune.templates.triton import wheel_key

TRUST = Trust(Signer.from_text("a-fleet-secret-of-32-characters!"))  # kernels are shared only under a key


def _key(machine: str) -> str:
    """A key in Triton's form for Triton 3.6.0: the version, then sha256 digests joined by '-'."""
    return "3.6.0" + "-".join(hashlib.sha256(f"{machine}:{i}".encode()).hexdigest() for i in range(3))

FILES = ("runtime/cache.py", "compiler/compiler.py", "backends/nvidia/driver.py", "language/core.py",
         "_C/libtriton.so")


def _record_row(root: Path, rel: str) -> str:
    data = (root / rel).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"triton/{rel},sha256={digest},{len(data)}"


def _installed(tmp_path: Path, skip: str = "") -> Path:
    """A Triton tree as a wheel installs it: the files, then the RECORD naming them (written last)."""
    root = tmp_path / "site" / "triton"
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"contents of {rel}")
    info = root.parent / "triton-3.6.0.dist-info"
    info.mkdir()
    rows = [_record_row(root, rel) for rel in FILES if rel != skip]
    (info / "RECORD").write_text("\n".join(rows + ["triton-3.6.0.dist-info/RECORD,,"]) + "\n")
    return root


@pytest.fixture(autouse=True)
def _no_sharing():
    wheel_key.unshare()
    yield
    wheel_key.unshare()
    kernels.stop_sharing()


@pytest.fixture
def shared_store(tmp_path):
    """A store this process shares kernels (and Triton's key) through, and an installed Triton tree."""
    store = Store(tmp_path / "store.db", trust=TRUST)
    if not kernels.share(store):
        pytest.skip("no Triton here: kernels are not shared")
    return store, _installed(tmp_path)


def test_the_signature_is_the_wheels_and_follows_its_record(tmp_path):
    root = _installed(tmp_path)
    sig = wheel_key.signature(root, "3.6.0")
    assert isinstance(sig, str) and sig == wheel_key.signature(root, "3.6.0")
    assert wheel_key.signature(root, "3.6.1") != sig
    # Another machine: the same wheel installed elsewhere, at another time, gives the same signature.
    other = _installed(tmp_path / "other")
    assert wheel_key.signature(other, "3.6.0") == sig
    # Bytecode beside the sources is not Triton's: it does not count.
    (root / "language" / "core.pyc").write_text("bytecode")
    assert wheel_key.signature(root, "3.6.0") == sig


@pytest.mark.parametrize("change", ["unlisted", "size", "newer", "no_record", "two_records"])
def test_files_the_record_does_not_vouch_for_give_no_signature(tmp_path, change):
    root = _installed(tmp_path)
    record = root.parent / "triton-3.6.0.dist-info" / "RECORD"
    if change == "unlisted":  # a plug-in backend, or a file of an editable build
        (root / "backends" / "plugin.py").write_text("x = 1")
    elif change == "size":
        (root / "_C" / "libtriton.so").write_text("a rebuilt library, longer than before")
        os.utime(root / "_C" / "libtriton.so", ns=(record.stat().st_mtime_ns,) * 2)
    elif change == "newer":  # edited in place after the install, same size
        path = root / "compiler" / "compiler.py"
        path.write_text(path.read_text().upper())
        later = record.stat().st_mtime_ns + 10 * 10**9
        os.utime(path, ns=(later, later))
    elif change == "no_record":
        record.unlink()
    else:
        (root.parent / "pytorch_triton-3.6.0.dist-info").mkdir()
        (root.parent / "pytorch_triton-3.6.0.dist-info" / "RECORD").write_text(record.read_text())
    assert wheel_key.signature(root, "3.6.0") is None


def test_the_shared_key_is_read_else_computed_and_offered(tmp_path):
    root = _installed(tmp_path)
    kept: dict[str, str] = {}
    computed: list[int] = []

    def compute() -> str:
        computed.append(1)
        return "KEY"

    assert wheel_key.shared_key(root, "3.6.0", compute) == "KEY" and kept == {}  # nothing shared
    wheel_key.share_with(kept.get, kept.__setitem__)
    assert wheel_key.shared_key(root, "3.6.0", compute) == "KEY"
    assert kept == {wheel_key.signature(root, "3.6.0"): "KEY"} and len(computed) == 2
    kept[wheel_key.signature(root, "3.6.0")] = _key("stored")
    assert wheel_key.shared_key(root, "3.6.0", compute) == _key("stored") and len(computed) == 2


def test_a_store_that_fails_or_files_that_change_while_hashing_keep_nothing(tmp_path):
    root = _installed(tmp_path)
    kept: dict[str, str] = {}

    def broken(sig: str) -> str:
        raise OSError("store down")

    wheel_key.share_with(broken, kept.__setitem__)
    assert wheel_key.shared_key(root, "3.6.0", lambda: "KEY") == "KEY" and len(kept) == 1

    def changing() -> str:  # the library rebuilt while Triton hashed it
        (root / "_C" / "libtriton.so").write_text("rebuilt while hashing, another size")
        return "HALF"

    kept.clear()
    wheel_key.share_with(kept.get, kept.__setitem__)
    assert wheel_key.shared_key(root, "3.6.0", changing) == "HALF" and kept == {}


def test_the_store_keeps_the_key_for_the_next_machine(tmp_path, shared_store):
    store, root = shared_store
    assert wheel_key.shared_key(root, "3.6.0", lambda: _key("machine-1")) == _key("machine-1")
    kernels.publish(store, [])  # written with the tune's other files, in the tuning thread
    kernels.stop_sharing()
    assert wheel_key.shared_key(root, "3.6.0", lambda: "NOT SHARED") == "NOT SHARED"  # sharing off
    # A new machine: the same wheel elsewhere, its own process state, the same store.
    assert kernels.share(Store(tmp_path / "store.db", trust=TRUST))
    other = _installed(tmp_path / "machine2")
    assert wheel_key.shared_key(other, "3.6.0", lambda: pytest.fail("hashed again")) == _key("machine-1")


def test_this_environments_triton_wheel_vouches_for_its_files():
    triton = pytest.importorskip("triton")
    root = Path(triton.__file__).parent
    if wheel_key.record_of(root) is None:
        pytest.skip("this Triton was not installed from a wheel with a RECORD")
    assert wheel_key.signature(root, triton.__version__) is not None


def test_a_store_that_fails_when_the_key_is_written_does_not_fail_the_tune(shared_store):
    store, root = shared_store
    assert wheel_key.shared_key(root, "3.6.0", lambda: "KEY") == "KEY"

    def down(key):
        raise OSError("store went away")

    store.has_kernel_files = down  # type: ignore[method-assign]
    assert kernels.publish(store, []) == 0  # logged, not raised
    assert store.kernel_files(kernels.KEY_PREFIX + wheel_key.signature(root, "3.6.0")) == {}


@pytest.mark.parametrize("stored", [
    "KEY-OF-ANOTHER-KIND",
    _key("x").replace("3.6.0", "3.5.0"),  # another Triton's
    _key("x") + "-" + "g" * 64,
    _key("x") + "\n",
], ids=["not_triton_form", "other_version", "not_hex", "trailing_newline"])
def test_a_stored_key_not_in_tritons_form_is_a_miss_with_one_line(tmp_path, stored, caplog):
    root = _installed(tmp_path)
    kept = {wheel_key.signature(root, "3.6.0"): stored}
    wheel_key.share_with(kept.get, lambda sig, key: None)
    with caplog.at_level("WARNING", logger="gemmtune"):
        assert wheel_key.shared_key(root, "3.6.0", lambda: _key("computed")) == _key("computed")
    (line,) = [r.getMessage() for r in caplog.records]
    assert "not in Triton 3.6.0's form" in line


def test_a_stored_key_that_is_not_text_or_too_long_is_a_miss(tmp_path, shared_store, caplog):
    store, root = shared_store
    sig = wheel_key.signature(root, "3.6.0")
    for data in (b"\xff\xfe" + _key("x").encode(), _key("x").encode() + b"0" * (kernels.MAX_KEY_BYTES + 1)):
        store.clear()
        store.put_kernel_files(kernels.KEY_PREFIX + sig, {"key": data})
        with caplog.at_level("WARNING", logger="gemmtune"):
            assert wheel_key.shared_key(root, "3.6.0", lambda: _key("computed")) == _key("computed")
    assert caplog.text.count("malformed") == 2 and store.path in caplog.text
