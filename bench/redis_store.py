"""The Redis store measured: lookup latency, the warm eager call, the first-use check, and a fleet of
processes tuning against one server (with the server killed and restarted mid-run).

Starts its own `redis-server` on a free loopback port.  Prints a table and writes JSON.

    python bench/redis_store.py --procs 64 --shapes 16 --out bench/results/redis_store.json
    python bench/redis_store.py --signing-only      # what a store key (signed entries) costs

`--signing-only` measures only what signing costs: cold lookups of problems of 1 and 64 rows read
without and with a key (the entries signed), interleaved, and the warm eager call without and with a key.
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


KEY = "bench-fleet-key-0123456789abcdef"


def signing(url: str, sizes: tuple[int, ...] = (1, 64), n: int = 200, rounds: int = 5) -> dict:
    """Cold lookups read without a key and with one (of the same entries, signed), interleaved: the
    median µs of each, per problem size (rows), the best of `rounds` rounds of `n` problems."""
    from gemmtune.store.keys import Row
    from gemmtune.store.locations import open_store
    from gemmtune.store.signing import Signer
    from gemmtune.store.trust import Trust

    trusts = {"no key": Trust(), "key": Trust(Signer.from_text(KEY))}
    out: dict = {}
    for size in sizes:
        rows = [Row("triton_mm", "ab" * 32, json.dumps({"BLOCK_K": 32, "BLOCK_M": 16 * (i + 1), "BLOCK_N": 64,
                                                        "num_stages": 3, "num_warps": 4}, separators=(",", ":")),
                    '{"GROUP_M":8}', 0.01 * (i + 1), "ok", "final") for i in range(size)]
        where = {name: url.replace("prefix=", f"prefix={size}{name.replace(' ', '')}") for name in trusts}
        for name, trust in trusts.items():
            writer = open_store(where[name], trust)
            for i in range(n):
                writer.save("0123456789abcdef", {}, f"mm(8x4, 4x2)/float32/{i:016x}|out=row", "d", rows, rows[0], False)
        best = {name: float("inf") for name in trusts}
        ratios = []
        for _ in range(rounds):
            readers = {name: open_store(where[name], trust) for name, trust in trusts.items()}
            times: dict = {name: [] for name in trusts}
            for i in range(n):
                for name, reader in readers.items():
                    t = time.perf_counter()
                    got = reader.load("0123456789abcdef", f"mm(8x4, 4x2)/float32/{i:016x}|out=row")
                    times[name].append(time.perf_counter() - t)
                    assert got.pick is not None and len(got.rows) == size
            for name in trusts:
                best[name] = min(best[name], statistics.median(times[name]) * 1e6)
            ratios += [k / u for k, u in zip(times["key"], times["no key"])]  # the same problem, one after the other
        out[f"{size} rows"] = dict(no_key_us=best["no key"], key_us=best["key"],
                                   overhead_pct=100 * (best["key"] / best["no key"] - 1),
                                   paired_overhead_pct=100 * (statistics.median(ratios) - 1))
    return out


def warm_calls_signed(store: str, keyed: str) -> dict:
    """µs per warm `gemmtune.mm` without a store key (on `store`) and with one (on `keyed`), alternately."""
    best = {"no key": float("inf"), "key": float("inf")}
    for _ in range(3):
        for name in best:
            if name == "key":
                os.environ["GEMMTUNE_STORE_KEY"] = KEY
            else:
                os.environ.pop("GEMMTUNE_STORE_KEY", None)
            best[name] = min(best[name], warm_call(keyed if name == "key" else store))
    os.environ.pop("GEMMTUNE_STORE_KEY", None)
    return dict(no_key_us=best["no key"], key_us=best["key"], added_us=best["key"] - best["no key"])


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
    p.add_argument("--signing-only", action="store_true", help="measure only what a store key costs")
    args = p.parse_args()
    if args.signing_only:
        return print_signing()
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


def print_signing() -> None:
    """`--signing-only`: the cost of a store key, printed as a table."""
    srv = RedisServer().start()
    try:
        cold = signing(srv.url(prefix="sig"))
        warm = warm_calls_signed(srv.url(prefix="sigwarm"), srv.url(prefix="sigwarmkey"))
    finally:
        srv.stop()
    print(f"machine: {os.cpu_count()} CPU cores")
    for size, r in cold.items():
        print(f"| cold redis lookup, {size} | no key {r['no_key_us']:.0f} µs | key {r['key_us']:.0f} µs | "
              f"{r['overhead_pct']:+.1f} % (median of pairs {r['paired_overhead_pct']:+.1f} %) |")
    print(f"| warm gemmtune.mm (redis store) | no key {warm['no_key_us']:.2f} µs | key {warm['key_us']:.2f} µs | "
          f"{warm['added_us']:+.2f} µs |")


if __name__ == "__main__":
    main()
