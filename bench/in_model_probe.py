"""Does the in-model check agree with itself and with whole-model rounds?  One process, one model.

After `gemmtune.warmup` (with its in-model check) of a bench/models.py model at `--m` tokens:
1. the check is run again on the same picks (is its verdict repeatable?);
2. every generated pick is switched on and off together, and the patched model is timed in
   interleaved rounds in both states, with a plain (unpatched) copy of the model in the same rounds:
   the picks' combined effect, and the patched layers' own cost (library state against plain).
Each round times `--iters` forwards per state (CUDA events) and the host time of their launches.

    python bench/in_model_probe.py --m 1 --rounds 30 --out in_model_probe_m1.json
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402  (fresh cache directories before torch is imported)
from model_rounds import time_round as time_block  # noqa: E402

torch, gemmtune = models.torch, models.gemmtune


def switches() -> list[Any]:
    """A Switch per tuned problem whose pick is a generated kernel (as `warmup`'s check builds them)."""
    from gemmtune.dispatch import eager
    from gemmtune.dispatch.in_model import Switch

    out = []
    for canon, sel in eager.selections().items():
        if not sel.winner.is_extern:
            out.append(Switch(sel.problem.op, canon, sel, 1.0, 1.0, None))
    return out


class All:
    """Every switch as one: the check's protocol applied to all the picks together."""

    def __init__(self, switches: list[Any]):
        self.switches, self.selection = switches, switches[0].selection

    def library(self, on: bool) -> None:
        for s in self.switches:
            s.library(on)


def interleaved(states: dict[str, tuple[Callable[[], Any], bool | None]], sw: list[Any], rounds: int,
                iters: int) -> dict[str, Any]:
    """Each state (a forward, and the switches on the library, on the picks, or left alone) timed in
    shuffled rounds; each one's median over the plain forward's time in the same round."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in states}
    for _ in range(3):
        for name, (fn, lib) in states.items():
            for s in sw:
                s.library(bool(lib))
            fn()
    order = list(states)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            fn, lib = states[name]
            if lib is not None:
                for s in sw:
                    s.library(lib)
            times[name].append(time_block(fn, iters))
    rows: dict[str, Any] = {}
    for name in states:
        ratio = [a[0] / b[0] for a, b in zip(times[name], times["plain"])]
        rows[name] = {"ms": statistics.median(t[0] for t in times[name]),
                      "host_ms": statistics.median(t[1] for t in times[name]),
                      "x_plain": statistics.median(ratio), "x_plain_q1_q3": statistics.quantiles(ratio, n=4)[::2]}
    lib_over_picks = [b[0] / a[0] for a, b in zip(times["picks"], times["library"])]
    rows["library_over_picks"] = {"median": statistics.median(lib_over_picks),
                                  "q1_q3": statistics.quantiles(lib_over_picks, n=4)[::2]}
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=1)
    p.add_argument("--model", default="stack")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default="in_model_probe.json")
    args = p.parse_args(argv)
    from gemmtune.dispatch.in_model import check_in_model

    base, inputs = models.build(args.model, args.m)
    plain = copy.deepcopy(base)
    result: dict[str, Any] = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                       "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}}
    with torch.no_grad():
        report = gemmtune.warmup(base, *inputs, progress=False)
        print(report.table())
        result["first_check"] = {r.problem: [r.winner, r.in_model.ratio, r.in_model.q1, r.in_model.kept]
                                 for r in report.rows if r.in_model}
        sw = switches()
        fwd = lambda: base(*inputs)  # noqa: E731
        host: list[float] = []

        def measure(fn: Callable[[], Any], n: int) -> float:
            ms, h = time_block(fn, n)
            host.append(h)
            return ms / 1e3 * n

        again = check_in_model(fwd, sw, cuda=True, measure=measure)
        result["second_check"] = {v.problem: [v.winner, v.ratio, v.q1, v.kept] for v in again}
        result["second_check_host_ms"] = host[:]
        print("second check:", result["second_check"])
        host.clear()
        together = check_in_model(fwd, [All(sw)], cuda=True, measure=measure)
        result["check_all_at_once"] = [together[0].ratio, together[0].q1, together[0].kept]
        result["check_all_at_once_host_ms"] = host[:]
        print("check, all picks at once:", result["check_all_at_once"])
        rows = interleaved({"plain": (lambda: plain(*inputs), None), "picks": (fwd, False),
                            "library": (fwd, True)}, sw, args.rounds, args.iters)
        result["rounds"] = rows
    print(json.dumps(rows, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
