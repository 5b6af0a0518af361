"""Where a model's first tune spends its time before timing starts: the worker's start, in pieces.

Each line is a fresh interpreter timed from the outside (median of `--repeat`): the bare interpreter,
`import torch`, a CUDA context, `import gemmtune` (the package) and the worker module, then the worker
as isolation starts it (`Worker(...)`: process start until it connects back) and one first tune of
a new GEMM problem with timestamped phase logs (cold Triton cache when `--cold`).

    python bench/worker_start.py --out worker_start.json
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

ROOT = Path(__file__).resolve().parents[1]
STEPS = {
    "python": "pass",
    "import torch": "import torch",
    "torch + CUDA context": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "import triton": "import triton",
    "import gemmtune": "import gemmtune",
    "import gemmtune.measure.worker": "import gemmtune.measure.worker",
    "worker module + CUDA + triton": ("import gemmtune.measure.worker, torch, triton; "
                                      "torch.zeros(1, device='cuda'); torch.cuda.synchronize()"),
}
FIRST_TUNE = r"""
import logging, time, sys
t0 = time.perf_counter()
logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms %(message)s", stream=sys.stdout)
import torch, gemmtune
from gemmtune.measure.process import Worker
t1 = time.perf_counter()
w = Worker("cuda", 60.0)
t2 = time.perf_counter()
w.close()
print(f"import {t1 - t0:.2f} s; Worker start {t2 - t1:.2f} s", flush=True)
a = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16).t()
t3 = time.perf_counter()
sel = gemmtune.tune("mm", a, b, settings=gemmtune.Settings(store="off"))
print(f"first tune {time.perf_counter() - t3:.2f} s (compile {sel.compile_s:.2f} s) winner {sel.winner.key}", flush=True)
"""


def wall(code: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default="worker_start.json")
    args = p.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    rows = {}
    for name, code in STEPS.items():
        rows[name] = statistics.median(wall(code, env) for _ in range(args.repeat))
        print(f"{name:<34} {rows[name]:6.2f} s", flush=True)
    cold = {**env, "TRITON_CACHE_DIR": tempfile.mkdtemp(), "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp()}
    out = subprocess.run([sys.executable, "-c", FIRST_TUNE], env=cold, capture_output=True, text=True)
    print(out.stdout[-6000:], out.stderr[-2000:])
    Path(args.out).write_text(json.dumps({"steps_s": rows, "first_tune_log": out.stdout[-20000:],
                                          "date": time.strftime("%Y-%m-%d")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
