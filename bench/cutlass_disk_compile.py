"""What the cutlass_hopper disk cache and compile processes save: compile in the caller, compile in
processes, and load from disk in a second process, for the first `--configs` configs of the space.

Runs where nvidia-cutlass-dsl is installed, on a CPU-only machine too (it compiles for
`CUTE_DSL_ARCH`, default sm_90a, against CPU operands; nothing is launched).  Each phase runs in a
fresh process with its own cache directory; prints a table and writes JSON.

    python bench/cutlass_disk_compile.py --configs 8 --processes 2 --out cutlass_disk_compile.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PHASE = """\
import json, sys, time, torch
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.cutlass import hopper_kernel, parallel
from gemmtune.templates.cutlass.hopper import config_space, kernel_src_hash
mode, n, processes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
configs = config_space()[:n]
a, b = torch.randn(96, 64, dtype=torch.bfloat16), torch.randn(64, 80, dtype=torch.bfloat16)
ki, src = KernelInputs.from_tensors("mm", a, b), kernel_src_hash()
t0 = time.perf_counter()
if mode == "processes":
    jobs = [hopper_kernel.job_for(c, torch.bfloat16, "n", False, (a, b), ki, src) for c in configs]
    parallel.start(jobs, env=hopper_kernel.compile_env(hopper_kernel._arch(a.device)),
                   processes=processes, min_batch=1)
for c in configs:
    hopper_kernel.build(c, torch.bfloat16, "n", False, (a, b), ki, src_hash=src)
print(json.dumps({"mode": mode, "configs": len(configs), "s": time.perf_counter() - t0}))
"""


def phase(mode: str, n: int, processes: int, cache: Path) -> dict:
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(cache), "CUTE_DSL_ARCH": os.environ.get("CUTE_DSL_ARCH", "sm_90a"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PHASE, mode, str(n), str(processes)], capture_output=True,
                          text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{mode}: exit {done.returncode}\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0  # including the interpreter's start and imports
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", type=int, default=8)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--out", default="cutlass_disk_compile.json")
    args = p.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="gemmtune-cutlass-disk-"))
    rows = [phase("caller", args.configs, 1, scratch / "a"), phase("processes", args.configs, args.processes, scratch / "b"),
            phase("from_disk", args.configs, 1, scratch / "a")]  # the caller's kernels, read by a new process
    meta = {"machine": f"{os.cpu_count()} cores", "arch": os.environ.get("CUTE_DSL_ARCH", "sm_90a"),
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
    print(f"{meta['machine']}, {meta['arch']}, {meta['date']}: {args.configs} configs")
    print("| phase | compile or load s | whole process s |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['s']:.2f} | {r['process_s']:.2f} |")
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
