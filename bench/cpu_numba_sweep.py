"""Every numba_mm tile config on common CPU shapes: the data behind the order of `_CONFIG_SPACE`.

Tunes each shape with the numba template only, exhaustively (every tile config x every group, store
off), keeps each fitted tile's best time, takes the minimum over `--repeat` passes (noise only adds),
and prints each shape's tiles ranked, as ratios to the best.  Keys are the tiles *after* fitting to the
problem (a (128, 64, 64) tile is (64, 64, 64) on M = 64).  Results move with the machine's load.

    PYTHONPATH=src python bench/cpu_numba_sweep.py --out bench/results/cpu_numba_sweep.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import gemmtune

SHAPES = ("128x128x128", "256x256x256", "512x384x256", "512x512x512", "1024x1024x1024", "64x1024x1024",
          "1024x64x1024", "2048x512x256", "32x4096x1024", "512x512x512:float64")  # M x N x K[:dtype]


def best_per_tile(shape: str) -> dict[str, float]:
    """Each fitted tile's best time (ms) over its groups on `shape`."""
    dims, _, dtype = shape.partition(":")
    M, N, K = (int(x) for x in dims.split("x"))
    dt = getattr(torch, dtype or "float32")
    a, b = torch.randn(M, K, dtype=dt), torch.randn(K, N, dtype=dt)
    settings = gemmtune.Settings(store="off", backends="numba", strategy="exhaustive", cpu_rep_ms=20.0, finalists=1)
    best: dict[str, float] = {}
    for t in gemmtune.tune("mm", a, b, settings=settings).timings:
        if t.ms is not None:
            c = t.choice.config_dict
            key = str((c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]))
            best[key] = min(best.get(key, float("inf")), t.ms)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    out: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):
        for shape in args.shapes.split(","):
            prev = out.get(shape, {})
            out[shape] = {k: min(v, prev.get(k, float("inf"))) for k, v in best_per_tile(shape).items()}
    for shape, tiles in out.items():
        ranked = sorted(tiles.items(), key=lambda kv: kv[1])
        print(f"{shape:>22}  " + "  ".join(f"{k} {v / ranked[0][1]:.2f}" for k, v in ranked))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpus": os.cpu_count(), "load": os.getloadavg()[0], "ms": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
