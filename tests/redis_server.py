"""A real `redis-server` for the tests: started on a free loopback port, stopped after."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One server process; `stop()` kills it (a server dying mid-run) and `start()` brings it back
    on the same port."""

    def __init__(self, port: int | None = None, password: str | None = None):
        self.port = port or free_port()
        self.password = password
        self.dir = Path(tempfile.mkdtemp(prefix="gemmtune-redis-"))
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 0, **query: str) -> str:
        auth = f":{self.password}@" if self.password else ""
        tail = "&".join(f"{k}={v}" for k, v in query.items())
        return f"redis://{auth}127.0.0.1:{self.port}/{db}" + (f"?{tail}" if tail else "")

    def start(self) -> "RedisServer":
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.dir), "--protected-mode", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


def require_redis() -> None:
    """Skip where neither the server nor the client is installed (`.ci/run` installs both)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian package redis-server; .ci/run installs it)")
    pytest.importorskip("redis")


@pytest.fixture(scope="module")
def server():
    """A real redis-server for a test module (skipped where none is installed); import it as a fixture."""
    require_redis()
    srv = RedisServer().start()
    yield srv
    srv.stop()


def fresh_location(request, tmp_path, kind: str, tag: str) -> str:
    """A new store location of `kind`: a SQLite file in `tmp_path`, or a fresh prefix on the module's server."""
    import uuid

    if kind == "sqlite":
        return str(tmp_path / "s.sqlite")
    return request.getfixturevalue("server").url(prefix=f"{tag}{uuid.uuid4().hex[:12]}")
