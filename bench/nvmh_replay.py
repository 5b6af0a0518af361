"""Stage-0 cost models on recorded H200 timings: the analytic model vs nvMatmulHeuristics (CPU only).

Replays `model_pruned` (keep the N binaries a cost model ranks best, then prescreen them) on a
dataset of recorded timings, once with `gemmtune.search.cost_model.estimate_ms` and once with nvMH
(`gemmtune.search.nvmh.NvmhModel` for the H200, TRITON target), and prints regret against the exhaustive
best, with and without the library kernel in the pool.

    PYTHONPATH=src python bench/nvmh_replay.py                       # the shipped H200 suite dataset
    PYTHONPATH=src python bench/nvmh_replay.py --dataset src/gemmtune/data/sweep_h200_bf16_triton_plain.jsonl.gz

Example:
    >>> rows = main(["--n", "20"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))


def main(argv: Sequence[str] | None = None) -> list[dict]:
    from gemmtune.search.nvmh import nvmh_model
    from gemmtune.offline.replay import replay
    from gemmtune.offline.simulate import load, load_shipped, without_library
    from gemmtune.pipeline.plan import default_options

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", help="recorded timings (default: the dataset shipped in the package)")
    p.add_argument("--device", default="NVIDIA H200")
    p.add_argument("--n", default="10,20,40", help="binaries kept by stage 0")
    args = p.parse_args(argv)
    shapes, dims = load(args.dataset) if args.dataset else load_shipped()
    nv = nvmh_model(args.device, 2)
    models = {"analytic": None, **({"nvmh": nv} if nv is not None else {})}
    if nv is None:
        print("nvidia-matmul-heuristics missing or GPU not covered: analytic model only", file=sys.stderr)
    rows = []
    for pool, pool_shapes in (("with cuBLAS", shapes), ("templates only", without_library(shapes))):
        for n in (int(x) for x in args.n.split(",")):
            for name, model in models.items():
                regrets, runs = [], []
                for shape, d in zip(pool_shapes, dims):
                    opts = replace(default_options(), stage0_n=n, problem=d, model=model)
                    out = replay(shape, "model_pruned", opts)
                    regrets.append(out.regret_pct)
                    runs.append(out.benchmark_runs)
                rows.append({"pool": pool, "n": n, "model": name, "mean_regret_pct": statistics.mean(regrets),
                             "max_regret_pct": max(regrets), "lossless": sum(r < 1e-9 for r in regrets),
                             "shapes": len(regrets), "runs": sum(runs)})
    print("| pool | N | model | mean regret % | max regret % | lossless shapes | runs |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pool']} | {r['n']} | {r['model']} | {r['mean_regret_pct']:.2f} | {r['max_regret_pct']:.2f} | "
              f"{r['lossless']}/{r['shapes']} | {r['runs']} |")
    return rows


if __name__ == "__main__":
    main()
