"""The Redis store's faults and URLs against a real redis-server: a save the server refuses never
holds up the others, causes named in words, fleets' keys kept apart by escaped patterns, no password
printed, URLs checked in one line, cache commands that fail loudly, and picks pending at exit written
or reported lost."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import gemmtune
from gemmtune.core.errors import SettingsError
from gemmtune.core.settings import Settings
from gemmtune.store import redis_codec, redis_faults
from gemmtune.store.keys import Row
from gemmtune.store.locations import open_store
from gemmtune.store.sqlite import Store

from redis_server import RedisServer, free_port, require_redis

ROOT = Path(__file__).resolve().parents[1]
FAST = Row("triton_mm", "h1", '{"BLOCK_M":64}', '{"GROUP_M":8}', 1.0, "ok", "prescreen")


@pytest.fixture
def server():
    """A server of this test's own (its configuration is changed)."""
    require_redis()
    srv = RedisServer().start()
    yield srv
    srv.stop()


def _client(srv: RedisServer):
    import redis

    return redis.Redis.from_url(srv.url(), decode_responses=True)


def _save(store, problem: str) -> Row:
    return store.save("env", {"device": "cpu"}, problem, f"mm({problem})", [FAST], FAST, False)


def _caught(call):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = call()
    return out, [str(w.message) for w in seen]


# -- a failed save never blocks the queue ------------------------------------------------------------

def test_a_queued_save_the_server_refuses_is_dropped_with_a_warning_and_the_rest_are_written(monkeypatch):
    require_redis()
    monkeypatch.setattr(redis_faults, "RETRY_S", 0.0)
    srv = RedisServer()
    url = srv.url(prefix="q", timeout="0.2")
    store = open_store(url)
    _, seen = _caught(lambda: (_save(store, "p1"), _save(store, "p2")))  # down: both queued
    assert any("did not answer" in w for w in seen)
    srv.start()
    try:
        monkeypatch.setattr(redis_codec, "_SAVE", _failing_save(redis_codec._SAVE, "p1"))  # its script fails
        _, seen = _caught(lambda: store.load("env", "p3"))  # the server answers: the queue is written first
        [dropped] = [w for w in seen if "did not take" in w]
        assert "q:pick:env:p1" in dropped and "the server refused the save script" in dropped
        assert open_store(url).load("env", "p2").pick == FAST  # the save behind it reached the server
        assert not store._pending and store.reachable
    finally:
        srv.stop()


def _failing_save(real, problem: str):
    """The save script, failing on the server for `problem` (as a script fails on a value it cannot take)."""
    failing = redis_codec.Lua("return redis.error_reply('ERR user_script:1: the save script failed on a value')")
    return lambda client, keys, args: (failing if keys[1].endswith(f":{problem}") else real)(client, keys, args)


def test_a_save_the_server_refuses_is_kept_in_memory_never_queued(server, monkeypatch):
    url = server.url(prefix="r")
    monkeypatch.setattr(redis_codec, "_SAVE", _failing_save(redis_codec._SAVE, "p1"))
    store = open_store(url)
    got, seen = _caught(lambda: _save(store, "p1"))
    assert got == FAST and _caught(lambda: store.load("env", "p1"))[0].pick == FAST  # this process keeps its pick
    assert len([w for w in seen if "did not take the pick of mm(p1)" in w]) == 1
    assert not any("did not answer" in w for w in seen)
    _save(store, "p2")
    assert open_store(url).load("env", "p2").pick == FAST


# -- errors name the real cause -------------------------------------------------------------------

def _out_of_memory(srv: RedisServer) -> None:
    _client(srv).config_set("maxmemory", "1")


def _read_only(srv: RedisServer) -> None:
    _client(srv).replicaof("127.0.0.1", str(free_port()))


@pytest.mark.parametrize("refuse, cause", [(_out_of_memory, "the server is out of memory"),
                                           (_read_only, "the server is a read-only replica")])
def test_a_server_that_refuses_every_save_is_named_and_the_saves_wait_for_it(server, monkeypatch, refuse, cause):
    monkeypatch.setattr(redis_faults, "RETRY_S", 0.0)
    url = server.url(prefix="s")
    store = open_store(url)
    refuse(server)
    got, seen = _caught(lambda: _save(store, "p1"))
    assert got == FAST and len(store._pending) == 1  # queued: the condition may end
    assert len(seen) == 1 and cause in seen[0] and "did not answer" not in seen[0]
    _client(server).config_set("maxmemory", "0")
    _client(server).replicaof("NO", "ONE")
    store.load("env", "p2")
    assert not store._pending and open_store(url).load("env", "p1").pick == FAST


def test_a_wrong_password_is_named_as_such():
    require_redis()
    srv = RedisServer(password="right-pw").start()
    try:
        store = open_store(srv.url().replace("right-pw", "wrong-pw"))
        _, seen = _caught(lambda: store.load("env", "p"))
        assert len(seen) == 1 and "the server refused the password" in seen[0] and "wrong-pw" not in seen[0]
    finally:
        srv.stop()


# -- SCAN patterns are escaped --------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["team\\", "te*", "t?am", "te[a]m", "team\\a"])
def test_clear_under_a_prefix_with_glob_characters_leaves_every_other_fleet_key(server, prefix):
    """Such a prefix is refused in a URL; a store given one otherwise still clears only its own keys."""
    client = _client(server)
    others = ["team:pick:e:p", "teama:pick:e:p", "team\\x:x", "tea:index", "te:index", "tXam:index", "team\\a\\:y"]
    for key in others:
        client.set(key, "1")
    store = open_store(server.url(prefix="placeholder"))
    store.prefix = prefix
    _save(store, "p1")
    assert client.zcard(f"{prefix}:index") == 1
    assert store.clear() == 1
    assert all(client.get(key) == "1" for key in others), [k for k in others if client.get(k) is None]
    assert client.zcard(f"{prefix}:index") == 0


def test_a_prefix_with_a_backslash_or_a_control_character_is_refused():
    require_redis()
    for prefix in ("team%5C", "a%0Ab", "a%09b"):
        with pytest.raises(SettingsError, match="prefix"):
            open_store(f"redis://127.0.0.1:1/0?prefix={prefix}")
    assert open_store("redis://127.0.0.1:1/0?prefix=team-a.b_c{1}").prefix == "team-a.b_c{1}"


# -- URLs: unknown parameters and a non-integer database are refused ---------------------------------

@pytest.mark.parametrize("url, words", [
    ("redis://h/0?foo=bar", ["unknown parameter 'foo'", "prefix, timeout", "password"]),
    ("redis://h/0?db=3", ["unknown parameter 'db'"]),
    ("redis://h/abc", ["database must be an integer"]),
    ("redis://h/0/1", ["database must be an integer"]),
    ("redis://h/0?ssl_cert_reqs=none", ["rediss://"]),
    ("rediss://h/0?ssl_cert_reqs=maybe", ["ssl_cert_reqs must be one of"]),
    ("redis://h/0?prefix=a&prefix=b", ["given twice"]),
    ("redis://:pa/ss@h/0", ["port must be an integer"]),
])
def test_a_url_the_store_cannot_use_is_refused_naming_what_is_wrong(url, words):
    require_redis()
    with pytest.raises(SettingsError) as caught:
        open_store(url)
    assert all(w in str(caught.value) for w in words), str(caught.value)
    assert "\n" not in str(caught.value) and "pa/ss" not in str(caught.value)


def test_the_accepted_parameters_open_a_store(server):
    store = open_store(server.url(prefix="ok", timeout="0.5") + "&username=default")
    assert (store.prefix, store.timeout) == ("ok", 0.5) and store.load("env", "p").pick is None
    assert open_store("rediss://h:1/2?ssl_cert_reqs=none&ssl_ca_certs=/x.pem").prefix == "gemmtune"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    run_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "gemmtune.cli", *args], capture_output=True, text=True,
                          timeout=300, env=run_env, cwd=ROOT)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0?foo=bar", "redis://127.0.0.1:1/abc"])
def test_the_cli_refuses_a_bad_url_with_one_line_and_exit_2(url):
    require_redis()
    done = _cli("cache", "ls", "--store", url)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "internal error" not in done.stderr


# -- passwords never printed --------------------------------------------------------------------------

def test_a_password_in_the_query_string_is_printed_nowhere(tmp_path):
    require_redis()
    srv = RedisServer(password="s3cret").start()
    other = RedisServer(password="another-pw").start()
    env = {"GEMMTUNE_CACHE_DIR": str(tmp_path)}
    try:
        for port in (srv.port, other.port):
            for url in (f"redis://127.0.0.1:{port}/0?password=s3cret", f"redis://:s3cret@127.0.0.1:{port}/0"):
                done = _cli("cache", "ls", "--store", url, env=env)
                assert "s3cret" not in done.stdout + done.stderr, (done.stdout, done.stderr)
                assert done.returncode == (0 if port == srv.port else 2), done.stderr
        dead = f"redis://127.0.0.1:{free_port()}/0?password=s3cret&timeout=0.2"
        done = _cli("tune", "--shape", "8x8x8", "--device", "cpu", "--backends", "extern", "--store", dead, env=env)
        assert done.returncode == 0 and "did not answer" in done.stderr, done.stderr
        assert "s3cret" not in done.stdout + done.stderr
    finally:
        srv.stop()
        other.stop()


# -- cache commands against a store that cannot answer ----------------------------------------------

@pytest.mark.parametrize("action", ["ls", "show", "clear", "export", "import"])
def test_a_cache_command_against_a_server_that_does_not_answer_exits_2_with_one_line(action, tmp_path, capsys):
    require_redis()
    from gemmtune.cli import main

    picks = tmp_path / "picks.json"
    a, b = torch.randn(8, 4), torch.randn(4, 2)
    gemmtune.tune("mm", a, b, backends=("extern",), settings=Settings(store=str(tmp_path / "s.sqlite")))
    picks.write_text(json.dumps(Store(str(tmp_path / "s.sqlite")).export()))
    url = f"redis://127.0.0.1:{free_port()}/0?timeout=0.2"
    arg = {"export": [str(tmp_path / "out.json")], "import": [str(picks)], "clear": ["--yes"]}.get(action, [])
    assert main(["cache", action, *arg, "--store", url]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "did not answer" in err, err
    assert ("nothing was done" in err) != (action == "import") and "imported" not in out
    assert not (tmp_path / "out.json").exists()


def test_a_cache_command_names_a_refused_password(capsys):
    require_redis()
    from gemmtune.cli import main

    srv = RedisServer(password="right-pw").start()
    try:
        assert main(["cache", "clear", "--yes", "--store", srv.url().replace("right-pw", "wrong-pw")]) == 2
        err = capsys.readouterr().err
        assert "the server refused the password" in err and "wrong-pw" not in err
    finally:
        srv.stop()


# -- picks pending at exit ------------------------------------------------------------------------------

EXIT_CHILD = """
import os, sys, time, torch, gemmtune
from gemmtune.core.settings import Settings
url, ready, go = sys.argv[1:4]
a, b = torch.randn(24, 16), torch.randn(16, 8)
sel = gemmtune.tune("mm", a, b, backends=("extern",), settings=Settings(store=url))
assert torch.allclose(sel(a, b), a @ b, atol=1e-4)
print(sel.problem.describe(), flush=True)
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
"""


@pytest.mark.parametrize("back_before_exit", [False, True])
def test_picks_pending_at_exit_are_written_or_reported_lost(tmp_path, back_before_exit):
    require_redis()
    srv = RedisServer()
    url = srv.url(prefix="exit", timeout="0.2")
    script = tmp_path / "child.py"
    script.write_text(EXIT_CHILD)
    ready, go = tmp_path / "ready", tmp_path / "go"
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT / "src")}
    child = subprocess.Popen([sys.executable, str(script), url, str(ready), str(go)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if back_before_exit:
            srv.start()
        go.touch()
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-2000:]
        lost = re.findall(r"\d+ picks made while the redis store \S+ did not answer were not written: lost", err)
        if back_before_exit:
            assert not lost and out.strip() in {p["describe"] for p in open_store(url).problems()}
        else:
            assert len(lost) == 1, err[-2000:]
    finally:
        child.kill()
        srv.stop()
