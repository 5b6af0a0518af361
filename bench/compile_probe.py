"""Probe: does compiling Triton configs in a thread pool run in parallel?  Prints wall times."""

import os
import sys
import time

import torch

from gemmtune.measure.compile import precompile
from gemmtune.templates.heuristics import get_template_configs
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.triton.mm import TritonMMTemplate

M, K, N = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "2048x2048x2048").split("x"))
workers = [int(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "1,16").split(",")]
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
