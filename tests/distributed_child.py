"""One rank of the distributed tests (tests/test_distributed.py): run under torchrun, or started
by hand with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT.  Arguments: the mode and a directory, where
each rank writes rank<N>.json."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import gemmtune

SHAPES = [(8 + 8 * i, 16 + 4 * (i % 3), 8 + 4 * (i % 4)) for i in range(8)]


def spmd(shapes=SHAPES, **options) -> dict:
    out = {}
    for m, k, n in shapes:
        torch.manual_seed(m * 31 + k)
        a, b = torch.randn(m, k), torch.randn(k, n)
        sel = gemmtune.tune("mm", a, b, backends=("extern", "numpy"), **options)
        assert torch.allclose(sel(a, b), a @ b, atol=1e-4)
        out[f"{m}x{k}x{n}"] = [sel.winner.key, bool(sel.cache_hit)]
    return out


class Many(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, xs):
        return [layer(x) for layer, x in zip(self.layers, xs)]


def dealt(shapes=SHAPES, **options) -> dict:
    layers = [torch.nn.Linear(k, n, bias=False) for _, k, n in shapes]
    torch.manual_seed(0)
    model = Many(layers)
    xs = [torch.randn(m, k) for m, k, _ in shapes]
    report = gemmtune.warmup(model, xs, backends=("extern", "numpy"), progress=False, **options)
    with torch.no_grad():
        for layer, x, y in zip(layers, xs, model(xs)):
            assert torch.allclose(y, x @ layer.weight.t(), atol=1e-4)
    return {r.problem: [r.winner, bool(r.from_store)] for r in report.rows}


def ranged() -> dict:
    """A range warm-up (`m=`) of two layers: every bucket problem dealt across the ranks; afterwards no
    batch size in the range tunes on any rank."""
    torch.manual_seed(0)
    shapes = SHAPES[:2]
    model = Many([torch.nn.Linear(k, n, bias=False) for _, k, n in shapes])
    report = gemmtune.warmup(model, [torch.randn(m, k) for m, k, _ in shapes], backends=("extern", "numpy"),
                             progress=False, m="1:16")
    tunes = gemmtune.dispatch_stats()["tunes"]
    with torch.no_grad():
        for batch in (1, 3, 9, 16):
            xs = [torch.randn(batch, k) for _, k, _ in shapes]
            for layer, x, y in zip(model.layers, xs, model(xs)):
                assert torch.allclose(y, x @ layer.weight.t(), atol=1e-4)
    return {"rows": {r.problem: [r.winner, bool(r.from_store)] for r in report.rows},
            "untuned": gemmtune.dispatch_stats()["tunes"] == tunes}


def groups() -> dict:
    """Ranks {0, 1} and {2, 3}: each pair shares its tunes within itself, given as `group=`."""
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both, in the same order
    mine = pairs[dist.get_rank() // 2]
    try:
        gemmtune.tune("mm", torch.randn(8, 4), torch.randn(4, 2), backends=("extern",), group="pairs")
        refused = None
    except TypeError as exc:
        refused = str(exc)
    return {"tune": spmd(SHAPES[:4], group=mine), "warmup": dealt(SHAPES[4:], group=mine),
            "off": spmd([(12, 12, 6)], group=mine, settings=gemmtune.Settings.from_env().with_(distributed="off")),
            "refused": refused}


def dies() -> dict:
    dist.barrier()  # every rank's gloo mesh is up: a rank dying inside it fails the others' init instead
    if dist.get_rank() == 2:
        os._exit(3)  # a rank that dies before the job's first shared tune
    try:
        spmd()
    except Exception as exc:  # any other kind is the test's failure, reported with its message
        return {"error": type(exc).__name__, "message": str(exc)[:300]}
    return {"error": None}


def wait_for_the_others(out: str, ranks=(0, 1, 3), limit_s: float = 240.0) -> None:
    """Rank 0 hosts the job's store: it stays until every other survivor wrote its result, so a rank
    slower to fail does not meet a vanished store (a test artefact, not the failure under test)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(out, f"rank{r}.json")) for r in ranks):
        time.sleep(0.1)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    result = {"spmd": spmd, "dealt": dealt, "ranged": ranged, "groups": groups, "dies": dies}[sys.argv[1]]()
    # One file per rank: torchrun merges the ranks' standard outputs, and two lines can interleave.
    with open(os.path.join(sys.argv[2], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"rank": dist.get_rank(), "result": result}, f)
    if sys.argv[1] == "dies":
        if dist.get_rank() == 0:
            wait_for_the_others(sys.argv[2])
        os._exit(0)
    dist.barrier()
    dist.destroy_process_group()
