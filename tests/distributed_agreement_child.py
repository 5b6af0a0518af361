"""One rank of tests/test_distributed_agreement.py, started by hand with RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT.  Arguments: the mode ("disagree" or "nobody") and a directory, where each rank writes
rank<N>.json: each step's outcome, by step name."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import gemmtune
from gemmtune.core.inputs import KernelInputs
from gemmtune.store import distributed
from gemmtune.store.memory import StoreKey

GARBAGE = ([("aten_mm", None, "{}", "{}", "fast", "ok", None)], None)  # a row whose ms is text


def key_of(shape) -> str:
    m, k, n = shape
    return StoreKey.of(KernelInputs.from_tensors("mm", torch.empty(m, k), torch.empty(k, n))).problem


def same_owner_pairs(count: int) -> list:
    """`count` disjoint pairs of shapes whose problems have the same owner among 2 ranks: without the
    announcement, the owner's broadcast for one would be taken by the other rank as the other's."""
    shapes = [(8 + 4 * i, 8, 4) for i in range(4 * count + 8)]
    by_owner: dict[int, list] = {0: [], 1: []}
    for s in shapes:
        by_owner[distributed.owner_of(key_of(s), 2)].append(s)
    pool = by_owner[0] if len(by_owner[0]) >= len(by_owner[1]) else by_owner[1]
    return [(pool[2 * i], pool[2 * i + 1]) for i in range(count)]


def tune(shape, **options):
    m, k, n = shape
    torch.manual_seed(m * 31 + k)
    a, b = torch.randn(m, k), torch.randn(k, n)
    sel = gemmtune.tune("mm", a, b, **{"backends": ("extern", "numpy"), **options})
    assert torch.allclose(sel(a, b), a @ b, atol=1e-4)
    return {"winner": sel.winner.key, "hit": bool(sel.cache_hit), "problem": sel.problem.describe()}


def attempt(fn, *args, **kw) -> dict:
    try:
        return fn(*args, **kw)
    except gemmtune.GemmtuneError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def warmup(shapes) -> dict:
    xs = [torch.randn(m, k) for m, k, _ in shapes]

    class Many(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(k, n, bias=False) for _, k, n in shapes])

        def forward(self, inputs):
            return [layer(x) for layer, x in zip(self.layers, inputs)]

    report = gemmtune.warmup(Many(), xs, backends=("extern",), progress=False)
    return {"rows": len(report.rows)}


def with_garbage_rows(fn, *args):
    real = distributed.rows_of
    distributed.rows_of = lambda stored: GARBAGE
    try:
        return attempt(fn, *args)
    finally:
        distributed.rows_of = real


def disagree(rank: int) -> dict:
    (a, b), (c, d), (e, f), (g, h) = same_owner_pairs(4)
    off = gemmtune.Settings.from_env().with_(distributed="off")
    out = {"shapes": {"a": a, "b": b, "c": c, "d": d}}
    out["two_problems"] = attempt(tune, (a, b)[rank])  # finding: rank 1 kept rank 0's timings under its key
    out["own_problem_alone"] = attempt(tune, (a, b)[rank], settings=off)  # nothing was stored: tuned here
    out["lone_call"] = attempt(tune, c if rank == 0 else d)  # rank 0's call of c alone meets rank 1's d
    out["then_together"] = attempt(tune, d)
    out["pools"] = attempt(tune, e, backends=("extern",) if rank == 0 else ("extern", "numpy"))
    owner = distributed.owner_of(key_of(f), 2)
    out["malformed_answer"] = with_garbage_rows(tune, f) if rank == owner else attempt(tune, f)
    out["malformed_answer_owner"] = owner
    out["malformed_share"] = with_garbage_rows(warmup, [g, h]) if rank == 1 else attempt(warmup, [g, h])
    out["together"] = [attempt(tune, s) for s in [(40, 12, 8), (44, 16, 12)]]
    return out


def nobody(rank: int) -> dict:
    """Rank 0 tunes alone in a job whose exchange group exists; rank 1 never tunes."""
    distributed.current("auto", gemmtune.Settings.from_env().distributed_timeout_s)  # the group, made by both
    if rank != 0:
        return {}
    started = time.monotonic()
    result = attempt(tune, (24, 8, 4))
    return {"alone": result, "seconds": time.monotonic() - started}


if __name__ == "__main__":
    dist.init_process_group("gloo")
    dist.barrier()  # every rank started: the exchange timeouts below measure waits, not start-up
    result = {"disagree": disagree, "nobody": nobody}[sys.argv[1]](dist.get_rank())
    with open(os.path.join(sys.argv[2], f"rank{dist.get_rank()}.json"), "w") as fh:
        json.dump({"rank": dist.get_rank(), "result": result}, fh)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # a timed-out exchange group cannot be torn down cleanly
