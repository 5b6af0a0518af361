"""The GPU runner: named jobs (GPU tests, benchmarks, the CuTe DSL set-up) run in lanes, one lane per GPU.

    python bench/gpu_run.py LANE [LANE ...]     # a LANE: job names joined by commas, or a preset
    python bench/gpu_run.py checks               # preset: the GPU tests and the six-shape comparison
    python bench/gpu_run.py cutlass-setup        # one job (here: the CuTe DSL from the carried .whl/dsl)
    python bench/gpu_run.py --list               # the jobs and presets
    python bench/gpu_run.py --dry-run warmup     # what would run where

Lane i runs on GPU i (CUDA_VISIBLE_DEVICES=i), all lanes at once, where the host has a GPU per lane;
otherwise the lanes run one after the other.  A lane runs its jobs in order; one that fails does not
stop the next.  Each job writes its output to $OUT/<job>.log (JSON, where the script writes one, to
$OUT/<job>.json; $OUT defaults to ./gpu_out); at the end the last --tail lines of each log are printed,
and the exit status is 1 when a job failed or timed out.

The CuTe DSL (docs/CUTLASS.md) is not installed on the GPU machine, which has no network: its wheels
are made on the CPU machine into the git-ignored .whl/ and carried (64 MiB at most per call):
  .whl/dsl/   nvidia_cutlass_dsl{,_libs_base,_libs_core} wheels + cu13.tar.xz (the
              nvidia-cutlass-dsl-libs-cu13 wheel unzipped, tar | xz -9e);
  .whl/deps/  cuda-bindings (cp312), cuda-pathfinder, protobuf: needed only where `cutlass-setup`
              prints "MISSING DEPS";
  .whl/ops/   nvidia-cutlass-operators and its dependencies: apache-tvm-ffi, torch-c-dlpack-ext (cp312)
              (networkx, which it needs too, is on the GPU machine already); .whl/dsl and .whl/ops together
              did not fit one call's 64 MiB beside the tree (2026-12-02), so each took its own call;
  .whl/cutlass/cutlass.tar.xz  all of the above unzipped in one xz pack (`python bench/cutlass_wheels.py`),
              which fits one call: `cutlass-all-setup` unpacks it.
`cutlass-setup` (carry .whl/dsl) unpacks them into .cutedsl/, which stays while the machine is warm;
`cutlass-deps` (carry .whl/deps) adds the dependencies, `cutlass-ops-setup` (carry .whl/ops) the
operators library; the jobs marked [DSL] run with .cutedsl/ on the path and are skipped without it.  cuda-bindings 13 needs a driver for CUDA 13 (>= 580).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Sequence, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_jobs import JOBS, PRESET_DOCS, PRESETS, PY, Job  # noqa: E402  (the runner's data, re-exported)

ROOT = Path(__file__).resolve().parents[1]
DSL = ROOT / ".cutedsl"

IMPORT_CHECK = {"dsl": "import cutlass, cutlass.cute; print('cutlass', cutlass.__version__)",
                "ops": "import cutlass.operators as ops; print('cutlass.operators', ops.__version__)",
                "cutlass": "import cutlass, cutlass.cute, cutlass.operators as ops; "
                           "print('cutlass', cutlass.__version__, 'cutlass.operators', ops.__version__)"}


def unpack(folder: str, log: TextIO) -> int:
    """Extract every wheel of .whl/<folder> (and a .tar.xz) into .cutedsl/; report what imports."""
    src = ROOT / ".whl" / folder
    if not src.is_dir():
        log.write(f"error: {src.relative_to(ROOT)}/ is not here: carry it with this call\n")
        return 2
    if folder in ("dsl", "cutlass"):  # a new .cutedsl/ (the others add to it)
        try:
            subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv"],
                           stdout=log, stderr=subprocess.STDOUT, check=False)
        except OSError as exc:
            log.write(f"nvidia-smi: {exc}\n")
        log.flush()
        shutil.rmtree(DSL, ignore_errors=True)
        DSL.mkdir()
    for wheel in sorted(src.glob("*.whl")):
        zipfile.ZipFile(wheel).extractall(DSL)
    for archive in sorted(src.glob("*.tar.xz")):
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(DSL, filter="tar")
    size = sum(p.stat().st_size for p in DSL.rglob("*") if p.is_file())
    log.write(f"{DSL.name}: {size / 2**20:.0f} MiB\n")
    log.flush()
    env = _env(Job("", dsl=True), gpu=None)
    deps = subprocess.run([PY, "-c", "import cuda.bindings.driver, google.protobuf"], env=env,
                          capture_output=True, check=False)
    if deps.returncode:
        log.write("MISSING DEPS: run cutlass-deps with .whl/deps carried\n")
    log.flush()
    found = subprocess.run([PY, "-c", IMPORT_CHECK.get(folder, IMPORT_CHECK["dsl"])],
                           env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    return 0 if folder == "dsl" else found.returncode




def parse_lanes(args: Sequence[str]) -> list[list[str]]:
    """Lanes of job names from the command line: a preset expands to its lanes.

    Example:
        >>> parse_lanes(["eager-probe,compare-six", "tests-api"])
        [['eager-probe', 'compare-six'], ['tests-api']]
    """
    lanes: list[list[str]] = []
    for arg in args:
        if arg in PRESETS:
            lanes.extend(lane.split(",") for lane in PRESETS[arg])
            continue
        names = [n for n in arg.split(",") if n]
        unknown = [n for n in names if n not in JOBS]
        if unknown or not names:
            raise ValueError(f"unknown job {', '.join(unknown) or repr(arg)} (see --list)")
        lanes.append(names)
    return lanes


def count_gpus() -> int:
    """GPUs on this host (`nvidia-smi -L`); 0 where there is none."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


def _env(job: Job, gpu: int | None) -> dict[str, str]:
    path = [str(ROOT / "src")]
    dsl = job.dsl or (job.dsl is None and DSL.is_dir())
    if dsl:
        path[:0] = [str(DSL / "nvidia_cutlass_dsl" / "dsl_packages"), str(DSL)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(path)}
    if dsl:
        env.setdefault("CUTE_DSL_CACHE_DIR", str(DSL / "cache"))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return {**env, **dict(job.env)}  # the job's own variables last (a CPU-only job hides the GPUs)


def run_job(name: str, job: Job, out: Path, gpu: int | None) -> str:
    """Run one job, its output in out/<name>.log; returns its outcome ("ok", "rc=N", "timed out", "skipped")."""
    with open(out / f"{name}.log", "w") as log:
        if job.dsl and not DSL.is_dir():
            log.write(f"skipped: no {DSL.name}/ (run cutlass-setup with .whl/dsl carried)\n")
            return "skipped"
        if job.unpack is not None:
            rc = unpack(job.unpack, log)
        else:
            argv = [a.format(out=out, job=name) for a in job.argv]
            try:
                rc = subprocess.run(argv, cwd=ROOT, env=_env(job, gpu), stdout=log, stderr=subprocess.STDOUT,
                                    timeout=job.timeout_s, check=False).returncode
            except subprocess.TimeoutExpired:
                log.write(f"\ntimed out after {job.timeout_s:.0f} s\n")
                return "timed out"
    return "ok" if rc == 0 else f"rc={rc}"


def plan(lanes: list[list[str]], gpus: int) -> list[tuple[int | None, list[str]]]:
    """(GPU, jobs) per lane: lane i on GPU i where every lane has a GPU, else all in turn on the default one.

    Example:
        >>> plan([["a"], ["b"]], gpus=2)
        [(0, ['a']), (1, ['b'])]
        >>> plan([["a"], ["b"]], gpus=1)
        [(None, ['a']), (None, ['b'])]
    """
    apart = len(lanes) > 1 and gpus >= len(lanes)
    return [(i if apart else None, lane) for i, lane in enumerate(lanes)]


def run_lanes(lanes: list[list[str]], out: Path, gpus: int, tail: int = 12) -> int:
    """Run the lanes (at once where each has a GPU), then print each log's end; 1 if a job did not end ok."""
    out.mkdir(parents=True, exist_ok=True)
    placed = plan(lanes, gpus)
    outcome: dict[str, str] = {}
    took: dict[str, float] = {}  # seconds per job

    def lane(gpu: int | None, names: list[str]) -> None:
        for name in names:
            t0 = time.perf_counter()
            outcome[name] = run_job(name, JOBS[name], out, gpu)
            took[name] = time.perf_counter() - t0
            print(f"{name}: {outcome[name]} in {took[name]:.0f} s", flush=True)

    if placed[0][0] is None:
        for gpu, names in placed:
            lane(gpu, names)
    else:
        threads = [threading.Thread(target=lane, args=p) for p in placed]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for gpu, names in placed:
        for name in names:
            lines = (out / f"{name}.log").read_text(errors="replace").splitlines()
            print(f"==> {name} (GPU {'default' if gpu is None else gpu}): {outcome[name]} <== {took[name]:.0f} s")
            print("\n".join(lines[-tail:]) if tail > 0 else "")
    return 0 if all(v in ("ok", "skipped") for v in outcome.values()) else 1


def describe(lanes: list[list[str]], out: Path, gpus: int) -> str:
    """The dry run: each lane's GPU and each job's command, one line each."""
    rows = []
    for i, (gpu, names) in enumerate(plan(lanes, gpus)):
        rows.append(f"lane {i} on GPU {'default' if gpu is None else gpu}" + ("" if gpu is not None or i == 0
                                                                              else " (after lane %d)" % (i - 1)))
        for name in names:
            job = JOBS[name]
            what = " ".join(a.format(out=out, job=name) for a in job.argv) if job.argv else job.doc
            limit = f" [timeout {job.timeout_s:.0f} s]" if job.timeout_s else ""
            rows.append(f"  {name}: {what}{limit}" + (" [DSL]" if job.dsl and "[DSL]" not in what else ""))
    return "\n".join(rows)


def listing() -> str:
    """--list: every job and preset, one line each."""
    width = max(map(len, [*JOBS, *PRESETS]))
    jobs = [f"  {n:<{width}}  {j.doc}" for n, j in JOBS.items()]
    presets = [f"  {n:<{width}}  {' | '.join(PRESETS[n])}\n  {'':<{width}}  {d}" for n, d in PRESET_DOCS.items()]
    return "\n".join(["jobs:", *jobs, "presets (lanes separated by |):", *presets])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="lanes: job names joined by commas, or a preset; see --list")
    p.add_argument("lanes", nargs="*", help="one lane per argument (a preset expands to its lanes)")
    p.add_argument("--list", action="store_true", help="print the jobs and presets")
    p.add_argument("--dry-run", action="store_true", help="print what would run on which GPU; run nothing")
    p.add_argument("--gpus", type=int, default=None, help="GPUs to assume (default: those nvidia-smi lists)")
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_out"), help="folder of the logs (default $OUT or gpu_out)")
    p.add_argument("--tail", type=int, default=12, help="last lines of each log printed at the end (default 12)")
    args = p.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    try:
        lanes = parse_lanes(args.lanes)
    except ValueError as exc:
        p.error(str(exc))
    if not lanes:
        p.error("name a job or a preset (see --list)")
    gpus = count_gpus() if args.gpus is None else args.gpus
    out = Path(args.out).resolve()
    if args.dry_run:
        print(describe(lanes, out, gpus))
        return 0
    return run_lanes(lanes, out, gpus, args.tail)


if __name__ == "__main__":
    sys.exit(main())
