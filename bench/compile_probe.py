"""Probe: does compiling Triton configs in a thread pool run in parallel?  Prints wall times (needs CUDA).

    python bench/compile_probe.py [MxKxN, default 2048x2048x2048] [workers, default 1,16]
"""

import argparse
import time

import torch

from gemmtune.measure.compile import precompile
from gemmtune.templates.heuristics import get_template_configs
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.triton.mm import TritonMMTemplate

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("shape", nargs="?", default="2048x2048x2048", help="MxKxN (default 2048x2048x2048)")
p.add_argument("workers", nargs="?", default="1,16", help="compile threads per run, comma-separated (default 1,16)")
args = p.parse_args()
M, K, N = (int(x) for x in args.shape.split("x"))
workers = [int(w) for w in args.workers.split(",")]
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
for i, w in enumerate(workers):
    # A different dtype per run so no run hits the previous run's cache.
    dt = [torch.bfloat16, torch.float16, torch.float32][i % 3]
    x, y = a.to(dt), b.to(dt)
    t = TritonMMTemplate()
    ki = KernelInputs.from_tensors("mm", x, y)
    choices = get_template_configs(ki, [t], "mm")[:64 * 4]
    t0 = time.perf_counter()
    res = precompile(choices, {t.uid: t}, ki, (x, y), timeout_s=300, workers=w)
    print(f"workers={w} dtype={dt} binaries={len(res.launchers)} failed={len(res.failures)} "
          f"wall={time.perf_counter() - t0:.1f}s", flush=True)
    for k, v in list(res.failures.items())[:3]:
        print("  fail", k, v)
