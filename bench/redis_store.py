"""The Redis store measured: lookup latency, the warm eager call, the first-use check, and a fleet of
processes tuning against one server (with the server killed and restarted mid-run).

Starts its own `redis-server` on a free loopback port.  Prints a table and writes JSON.

    python bench/redis_store.py --procs 64 --shapes 16 --out bench/results/redis_store.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from redis_server import RedisServer  # noqa: E402

CHILD = """
import json, sys, torch, gemmtune
from gemmtune.core.settings import Settings
url, shapes = sys.argv[1], json.loads(sys.argv[2])
out = {}
for m, k, n in shapes:
    torch.manual_seed(m * 7 + k)
    a, b = torch.randn(m, k), torch.randn(k, n)
    sel = gemmtune.tune("mm", a, b, backends=("extern", "numpy"), settings=Settings.from_env(store=url))
    ok = torch.allclose(sel(a, b), a @ b, atol=1e-3, rtol=1e-3)
    out[f"{m}x{k}x{n}"] = [sel.winner.key, bool(sel.cache_hit), bool(ok)]
print(json.dumps(out))
"""


def _shapes(n: int) -> list[list[int]]:
    return [[8 * (1 + i % 8), 16 * (1 + i // 8 % 4), 8 * (2 + i % 3)] for i in range(n)]


def fleet(url: str, procs: int, shapes: list, env: dict, kill: RedisServer | None = None) -> dict:
    """`procs` processes tune `shapes` at once; with `kill`, the server dies 2 s in and returns 3 s later."""
    script = Path(tempfile.mkdtemp()) / "child.py"
    script.write_text(CHILD)
    started = time.perf_counter()
    ps = [subprocess.Popen([sys.executable, str(script), url, json.dumps(shapes)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env) for _ in range(procs)]
    if kill is not None:
        time.sleep(2.0)
        kill.stop()
        time.sleep(3.0)
        kill.start()
    outs = [p.communicate(timeout=1800) for p in ps]
    res = [json.loads(o.strip().splitlines()[-1]) if p.returncode == 0 else None for p, (o, _) in zip(ps, outs)]
    done = [r for r in res if r is not None]
    agree = all(len({r[s][0] for r in done}) == 1 for s in (done[0] if done else {}))
    return dict(procs=procs, finished=len(done), seconds=time.perf_counter() - started, agree=agree,
                correct=all(v[2] for r in done for v in r.values()),
                hits=sum(v[1] for r in done for v in r.values()), tunes=sum(len(r) for r in done))


def lookups(url: str, n: int = 200) -> dict:
    """Cold lookups (`load` of a problem this process has not read) and warm ones (read before)."""
    from gemmtune.store.keys import Row
    from gemmtune.store.locations import open_store

    store = open_store(url)
    pick = Row("aten_mm", None, "{}", "{}", 1.0, "ok", "final")
    for i in range(n):
        store.save("env", {}, f"p{i}", "d", [pick], pick, False)
    reader = open_store(url)
    cold, warm = [], []
    for i in range(n):
        t = time.perf_counter()
        reader.load("env", f"p{i}")
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        reader.load("env", f"p{i}")
        warm.append(time.perf_counter() - t)
    return dict(cold_us=statistics.median(cold) * 1e6, cold_p99_us=sorted(cold)[int(0.99 * n)] * 1e6,
                warm_us=statistics.median(warm) * 1e6)


def warm_call(store: str, reps: int = 20000) -> float:
    """µs per warm `gemmtune.mm` with `store` (the dispatch dict answers; the store is not read)."""
    import torch

    import gemmtune

    os.environ["GEMMTUNE_STORE"] = store
    gemmtune.clear_dispatch_cache()
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    gemmtune.mm(a, b, backends=("extern", "numpy"))
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            gemmtune.mm(a, b, backends=("extern", "numpy"))
        best = min(best, (time.perf_counter() - t) / reps * 1e6)
    return best


def first_use_check(url: str, sqlite: str) -> dict:
    """Seconds of a full store hit in a new process state, shared (checked) and not."""
    import torch

    import gemmtune
    from gemmtune.core.settings import Settings
    from gemmtune.store.locations import forget_stores

    out = {}
    for name, where in (("redis (checked)", url), ("sqlite", sqlite)):
        times = []
        for m in (64, 256, 512):
            a, b = torch.randn(m, m), torch.randn(m, m)
            gemmtune.tune("mm", a, b, backends=("extern", "numpy"), settings=Settings(store=where))
            forget_stores()
            t = time.perf_counter()
            assert gemmtune.tune("mm", a, b, backends=("extern", "numpy"), settings=Settings(store=where)).cache_hit
            times.append(time.perf_counter() - t)
        out[name] = times
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=64)
    p.add_argument("--shapes", type=int, default=16)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    srv = RedisServer().start()
    cache = tempfile.mkdtemp()
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": cache, "GEMMTUNE_NOISE_LIMIT": "1e9"}
    res: dict = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                 "machine": f"{os.cpu_count()} CPU cores"}
    try:
        res["lookups"] = lookups(srv.url(prefix="lookups"))
        res["warm_call_us"] = {"sqlite": warm_call(str(Path(cache) / "w.sqlite")), "redis": warm_call(srv.url(prefix="w"))}
        res["full_hit_s"] = first_use_check(srv.url(prefix="check"), str(Path(cache) / "c.sqlite"))
        shapes = _shapes(args.shapes)
        res["fleet"] = fleet(srv.url(prefix="fleet"), args.procs, shapes, env)
        res["fleet_again"] = fleet(srv.url(prefix="fleet"), min(args.procs, 8), shapes, env)
        from gemmtune.store.locations import open_store

        res["picks_stored"] = {"fleet": len(open_store(srv.url(prefix="fleet")).problems())}
        other = RedisServer().start()  # killed and restarted: a server of its own (it keeps nothing on disk)
        try:
            res["fleet_killed"] = fleet(other.url(prefix="killed", timeout="0.2"), min(args.procs, 16), shapes, env,
                                        kill=other)
            res["picks_stored"]["killed"] = len(open_store(other.url(prefix="killed")).problems())
        finally:
            other.stop()
    finally:
        srv.stop()
    lk, wc = res["lookups"], res["warm_call_us"]
    print(f"| lookup | cold {lk['cold_us']:.0f} µs (p99 {lk['cold_p99_us']:.0f}) | warm {lk['warm_us']:.1f} µs |")
    print(f"| warm gemmtune.mm | sqlite {wc['sqlite']:.2f} µs | redis {wc['redis']:.2f} µs |")
    for k, v in res["full_hit_s"].items():
        print(f"| full store hit, m = 64/256/512 | {k} | " + " / ".join(f"{t * 1e3:.2f} ms" for t in v) + " |")
    for k in ("fleet", "fleet_again", "fleet_killed"):
        f = res[k]
        print(f"| {k} | {f['finished']}/{f['procs']} finished | agree {f['agree']} | correct {f['correct']} | "
              f"hits {f['hits']}/{f['tunes']} | {f['seconds']:.1f} s |")
    print(f"| picks stored ({args.shapes} shapes) | {res['picks_stored']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
