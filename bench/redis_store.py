"""The shared store measured: Redis lookups, the warm eager call, a fleet of processes tuning against one
server (also one killed and restarted mid-run); what a store key costs; what the first-use check costs.

The default run starts its own `redis-server`: lookup latency, µs per warm `gemmtune.mm` (SQLite and Redis
stores), `--procs` processes tuning `--shapes` problems at once (they must agree and be correct), again on
the filled store, and on a server killed 2 s in.  `--signing-only`: cold lookups and the warm call without
and with a store key.  `--first-use`: per size, a hit from a SQLite store opened afresh, trusted and shared
(`store_shared="on"`: the pick checked against the float64 reference first), and the check alone.

    python bench/redis_store.py --procs 64 --shapes 16 --out redis_store.json
    python bench/redis_store.py --signing-only --out signing.json
    python bench/redis_store.py --first-use --device cuda --backends triton --sizes 256,1024,4096
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

KEY = "bench-fleet-key-0123456789abcdef"  # the store key of --signing-only
CHILD = """
import json, sys, torch, gemmtune
from gemmtune.core.settings import Settings
url, shapes, out = sys.argv[1], json.loads(sys.argv[2]), {}
for m, k, n in shapes:
    torch.manual_seed(m * 7 + k)
    a, b = torch.randn(m, k), torch.randn(k, n)
    sel = gemmtune.tune("mm", a, b, backends=("extern", "numpy"), settings=Settings.from_env(store=url))
    ok = torch.allclose(sel(a, b), a @ b, atol=1e-3, rtol=1e-3)
    out[f"{m}x{k}x{n}"] = [sel.winner.key, bool(sel.cache_hit), bool(ok)]
print(json.dumps(out))
"""


def fleet(url: str, procs: int, shapes: list, env: dict, kill: RedisServer | None = None) -> dict:
    """`procs` processes tune `shapes` at once; with `kill`, the server dies 2 s in and returns 3 s later."""
    started = time.perf_counter()
    ps = [subprocess.Popen([sys.executable, "-c", CHILD, url, json.dumps(shapes)], stdout=subprocess.PIPE,
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
    store, pick = open_store(url), Row("aten_mm", None, "{}", "{}", 1.0, "ok", "final")
    for i in range(n):
        store.save("env", {}, f"p{i}", "d", [pick], pick, False)
    reader, cold, warm = open_store(url), [], []
    for i in range(n):
        for seen in (cold, warm):  # a problem's first load, then a second
            t = time.perf_counter()
            reader.load("env", f"p{i}")
            seen.append(time.perf_counter() - t)
    return dict(cold_us=statistics.median(cold) * 1e6, cold_p99_us=sorted(cold)[int(0.99 * n)] * 1e6,
                warm_us=statistics.median(warm) * 1e6)


def signing(url: str, sizes: tuple[int, ...] = (1, 64), n: int = 200, rounds: int = 5) -> dict:
    """Cold lookups of entries of `sizes` rows, without a key and with one, in turn per problem: each one's
    best median µs over `rounds` rounds of `n` problems, and the median of the paired ratios."""
    from gemmtune.store.keys import Row
    from gemmtune.store.locations import open_store
    from gemmtune.store.signing import Signer
    from gemmtune.store.trust import Trust
    trusts, out = {"no key": Trust(), "key": Trust(Signer.from_text(KEY))}, {}
    problem = "mm(8x4, 4x2)/float32/{:016x}|out=row".format
    for size in sizes:
        rows = [Row("triton_mm", "ab" * 32, json.dumps({"BLOCK_K": 32, "BLOCK_M": 16 * (i + 1), "BLOCK_N": 64,
                                                        "num_stages": 3, "num_warps": 4}, separators=(",", ":")),
                    '{"GROUP_M":8}', 0.01 * (i + 1), "ok", "final") for i in range(size)]
        where = {name: url.replace("prefix=", f"prefix={size}{name.replace(' ', '')}") for name in trusts}
        for name, trust in trusts.items():
            writer = open_store(where[name], trust)
            for i in range(n):
                writer.save("0123456789abcdef", {}, problem(i), "d", rows, rows[0], False)
        best, ratios = {name: float("inf") for name in trusts}, []
        for _ in range(rounds):
            readers = {name: open_store(where[name], trust) for name, trust in trusts.items()}
            times: dict = {name: [] for name in trusts}
            for i in range(n):
                for name, reader in readers.items():
                    t = time.perf_counter()
                    assert len(reader.load("0123456789abcdef", problem(i)).rows) == size
                    times[name].append(time.perf_counter() - t)
            best = {name: min(best[name], statistics.median(times[name]) * 1e6) for name in trusts}
            ratios += [k / u for k, u in zip(times["key"], times["no key"])]
        out[f"{size} rows"] = dict(no_key_us=best["no key"], key_us=best["key"],
                                   overhead_pct=100 * (best["key"] / best["no key"] - 1),
                                   paired_overhead_pct=100 * (statistics.median(ratios) - 1))
    return out


def warm_call(store: str, key: str | None = None, reps: int = 20000) -> float:
    """µs per warm `gemmtune.mm` with `store` (and a store key): the dispatch dict answers, no store read."""
    import torch

    import gemmtune
    os.environ.pop("GEMMTUNE_STORE_KEY", None)
    os.environ.update(GEMMTUNE_STORE=store, **({"GEMMTUNE_STORE_KEY": key} if key else {}))
    gemmtune.clear_dispatch_cache()
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    gemmtune.mm(a, b, backends=("extern", "numpy"))
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            gemmtune.mm(a, b, backends=("extern", "numpy"))
        best = min(best, (time.perf_counter() - t) / reps * 1e6)
    os.environ.pop("GEMMTUNE_STORE_KEY", None)
    return best


def first_use(device: str, size: int, backends: tuple[str, ...], reps: int, where: Path) -> dict:
    """One size: a hit trusted and shared (checked), and the check alone (`store.checked.wrong_output`)."""
    import torch

    import gemmtune
    from gemmtune.core.settings import Settings
    from gemmtune.store.checked import wrong_output
    from gemmtune.store.locations import forget_stores
    sync, dtype = (torch.cuda.synchronize, torch.bfloat16) if device.startswith("cuda") else (lambda: None, torch.float32)
    torch.manual_seed(size)
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    base = dict(store=str(where / f"store-{size}.sqlite"), backends=backends)
    first = gemmtune.tune("mm", a, b, settings=Settings(**base))  # fills the store
    kinds = {"trusted": Settings(**base), "shared": Settings(**base, store_shared="on")}
    ms: dict[str, list[float]] = {"trusted": [], "shared": [], "check": []}
    for _ in range(reps):
        for kind, settings in kinds.items():
            forget_stores()  # a fresh store object: what a new process opens, nothing checked yet
            gemmtune.clear_dispatch_cache()
            sync()
            t0 = time.perf_counter()
            hit = gemmtune.tune("mm", a, b, settings=settings)
            sync()
            ms[kind].append((time.perf_counter() - t0) * 1e3)
            assert hit.cache_hit and hit.winner == first.winner, (kind, hit.winner, first.winner)
        t0 = time.perf_counter()
        assert wrong_output(first.problem, lambda: hit(a, b), (a, b)) is None
        sync()
        ms["check"].append((time.perf_counter() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in ms.items()}
    return dict(size=size, dtype=str(dtype).replace("torch.", ""), pick=first.winner.key, reps=reps,
                hit_trusted_ms=round(med["trusted"], 4), hit_checked_ms=round(med["shared"], 4),
                check_per_pick_ms=round(med["shared"] - med["trusted"], 4), check_alone_ms=round(med["check"], 4))


def run_default(args: argparse.Namespace, res: dict) -> None:
    """Lookups, warm calls and the fleets on servers of this run's own; their table."""
    from gemmtune.store.locations import open_store
    srv, cache = RedisServer().start(), Path(tempfile.mkdtemp())
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(cache), "GEMMTUNE_NOISE_LIMIT": "1e9"}
    try:
        res["lookups"] = lookups(srv.url(prefix="lookups"))
        res["warm_call_us"] = {"sqlite": warm_call(str(cache / "w.sqlite")), "redis": warm_call(srv.url(prefix="w"))}
        shapes = [[8 * (1 + i % 8), 16 * (1 + i // 8 % 4), 8 * (2 + i % 3)] for i in range(args.shapes)]
        res["fleet"] = fleet(srv.url(prefix="fleet"), args.procs, shapes, env)
        res["fleet_again"] = fleet(srv.url(prefix="fleet"), min(args.procs, 8), shapes, env)
        other = RedisServer().start()  # killed and restarted: a server of its own (it keeps nothing on disk)
        try:
            res["fleet_killed"] = fleet(other.url(prefix="killed", timeout="0.2"), min(args.procs, 16), shapes, env,
                                        kill=other)
            res["picks_stored"] = {"fleet": len(open_store(srv.url(prefix="fleet")).problems()),
                                   "killed": len(open_store(other.url(prefix="killed")).problems())}
        finally:
            other.stop()
    finally:
        srv.stop()
    lk, wc = res["lookups"], res["warm_call_us"]
    print(f"| lookup | cold {lk['cold_us']:.0f} µs (p99 {lk['cold_p99_us']:.0f}) | warm {lk['warm_us']:.1f} µs |")
    print(f"| warm gemmtune.mm | sqlite {wc['sqlite']:.2f} µs | redis {wc['redis']:.2f} µs |")
    for k in ("fleet", "fleet_again", "fleet_killed"):
        print("| {k} | {finished}/{procs} finished | agree {agree} | correct {correct} | hits {hits}/{tunes} | "
              "{seconds:.1f} s |".format(k=k, **res[k]))
    print(f"| picks stored ({args.shapes} shapes) | {res['picks_stored']} |")


def run_signing(_args: argparse.Namespace, res: dict) -> None:
    """`--signing-only`: the cost of a store key; its table."""
    srv = RedisServer().start()
    try:
        res["cold"] = cold = signing(srv.url(prefix="sig"))
        calls = [(warm_call(srv.url(prefix="sigwarm")), warm_call(srv.url(prefix="sigwarmkey"), KEY)) for _ in range(3)]
        no_key, key = (min(c[i] for c in calls) for i in (0, 1))  # alternately, the best of three each
        res["warm"] = warm = dict(no_key_us=no_key, key_us=key, added_us=key - no_key)
    finally:
        srv.stop()
    for size, r in cold.items():
        print(f"| cold redis lookup, {size} | no key {r['no_key_us']:.0f} µs | key {r['key_us']:.0f} µs | "
              f"{r['overhead_pct']:+.1f} % (median of pairs {r['paired_overhead_pct']:+.1f} %) |")
    print(f"| warm gemmtune.mm (redis store) | no key {warm['no_key_us']:.2f} µs | key {warm['key_us']:.2f} µs | "
          f"{warm['added_us']:+.2f} µs |")


def run_first_use(args: argparse.Namespace, res: dict) -> None:
    """`--first-use`: the check's cost per pick at each size; its table."""
    backends = tuple(x for x in args.backends.split(",") if x)
    with tempfile.TemporaryDirectory(prefix="gemmtune-first-use-") as tmp:
        res.update(device=args.device, backends=list(backends), rows=[
            first_use(args.device, int(size), backends, args.reps, Path(tmp)) for size in args.sizes.split(",")])
    print("| size | dtype | pick | hit trusted ms | hit checked ms | check per pick ms | check alone ms |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for r in res["rows"]:
        print(f"| {r['size']} | {r['dtype']} | {r['pick'][:40]} | {r['hit_trusted_ms']:.3f} | "
              f"{r['hit_checked_ms']:.3f} | {r['check_per_pick_ms']:.3f} | {r['check_alone_ms']:.3f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--signing-only", action="store_true", help="measure what a store key costs")
    p.add_argument("--first-use", action="store_true", help="measure the first-use check of a shared store's pick")
    p.add_argument("--procs", type=int, default=64, help="processes of the fleet")
    p.add_argument("--shapes", type=int, default=16, help="problems each process of the fleet tunes")
    p.add_argument("--device", default="cpu", help="--first-use: cpu or cuda[:N]")
    p.add_argument("--sizes", default="64,256,512,1024", help="--first-use: square sizes, comma-separated")
    p.add_argument("--backends", default="extern", help="--first-use: backend families (a Triton pick: triton)")
    p.add_argument("--reps", type=int, default=7, help="--first-use: repetitions (medians)")
    p.add_argument("--out", default=None, help="write the JSON here")
    args = p.parse_args(argv)
    res: dict = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                 "machine": f"{os.cpu_count()} CPU cores"}
    (run_first_use if args.first_use else run_signing if args.signing_only else run_default)(args, res)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
