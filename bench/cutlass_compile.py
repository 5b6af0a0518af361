"""JIT-compile (not run) the cutlass_hopper kernel for a few configs and both B layouts; print the
compile time of each.  Runs on a CPU-only machine with `CUTE_DSL_ARCH=sm_90a` (validated there: it
compiles) and on the GPU machine (`python bench/gpu_run.py cutlass-compile`).
Usage: python bench/cutlass_compile.py [all]"""

import os
import sys
import time

import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from gemmtune.core.inputs import KernelInputs  # noqa: E402
from gemmtune.templates.cutlass import hopper_kernel  # noqa: E402
from gemmtune.templates.cutlass.hopper import config_space  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
M, N, K = 333, 520, 264
configs = config_space() if sys.argv[1:] == ["all"] else [
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, stages=4, cluster_m=1, cluster_n=1),
    dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, stages=3, cluster_m=2, cluster_n=1),
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, stages=3, cluster_m=1, cluster_n=2),
]
for cfg in configs:
    for b_major in ("k", "n"):
        for bias in (False, True):
            a = torch.randn(M, K, dtype=torch.bfloat16, device=dev)
            b = torch.randn(N, K, dtype=torch.bfloat16, device=dev).t() if b_major == "k" else \
                torch.randn(K, N, dtype=torch.bfloat16, device=dev)
            c = torch.randn(N, dtype=torch.bfloat16, device=dev)
            ki = KernelInputs.from_tensors("addmm" if bias else "mm", *((c, a, b) if bias else (a, b)))
            t0 = time.perf_counter()
            hopper_kernel.build(cfg, torch.bfloat16, b_major, bias, (c, a, b) if bias else (a, b), ki)
            print(f"compiled {cfg} B={b_major}-major bias={bias}: {time.perf_counter() - t0:.2f} s", flush=True)
