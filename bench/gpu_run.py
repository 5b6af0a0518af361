"""The GPU runner: named jobs (the GPU tests, the benchmarks of bench/, the CUTLASS set-up) run in lanes on
a GPU machine, lane i on GPU i, all at once where the host has a GPU per lane (else one after the other).

Each job writes $OUT/<job>.log (and $OUT/<job>.json where its script writes JSON; $OUT: ./gpu_out unless
set); the end of each log is printed; exit status 1 if a job failed.  [DSL] jobs need .cutedsl/, which the
job `cutlass-setup` unpacks from the carried .whl/cutlass (`python bench/cutlass_wheels.py` packs it).

    python bench/gpu_run.py --list                      # the jobs and presets
    python bench/gpu_run.py tests-core,compare-six tests-api   # any jobs: one argument per lane
    python bench/gpu_run.py --dry-run --gpus 2 models   # what would run where
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TextIO

ROOT = Path(__file__).resolve().parents[1]
DSL, PY = ROOT / ".cutedsl", sys.executable
PYTEST = (PY, "-m", "pytest", "-q", "-p", "no:cacheprovider")
IMPORT_CHECK = ("import cutlass, cutlass.cute, cutlass.operators as ops; "
                "print('cutlass', cutlass.__version__, 'cutlass.operators', ops.__version__)")


@dataclass(frozen=True)
class Job:
    """A command (`{out}`: the output folder, `{job}`: the job's name), or the pack unpacked (`unpack`);
    `dsl` True: runs with .cutedsl/ on the path, skipped without it; None: with it where it is there."""

    doc: str
    argv: tuple[str, ...] = ()
    timeout_s: float | None = None
    dsl: bool | None = False
    env: tuple[tuple[str, str], ...] = ()
    unpack: bool = False


def gpu_tests(*names: str) -> tuple[str, ...]:
    """pytest over tests/gpu/<name>.py, with -s: the tests' own prints reach the log."""
    return (*PYTEST, "-s", *(f"tests/gpu/{n}.py" for n in names))


def script(name: str, *args: str) -> tuple[str, ...]:
    """`python bench/<name>.py ARGS --out {out}/{job}.json`."""
    return (PY, f"bench/{name}.py", *args, "--out", "{out}/{job}.json")


SIX_SHAPES = "square-2048,square-8192,odd-4097,llama3-8b-qkv-m1,llama3-8b-o-m16,llama3-8b-gate_up-m128"
FP8_SHAPES = ("llama3-8b-q_o-m16-rowwise,llama3-8b-gate_up-m128-tensorwise,llama3-8b-down-m1024-rowwise,"
              "llama3-70b-q_o-m8192-tensorwise")
PROTOCOL_ROOT = "/tmp/gemmtune-protocol"  # the caches a case's first calls leave for its steady state
FIRST = ("--steady", "", "--root", PROTOCOL_ROOT)
STEADY = ("--first", "", "--train", "--rounds", "31", "--iters", "20", "--root", PROTOCOL_ROOT)
JOBS: dict[str, Job] = {
    "tests-all": Job("tests/gpu, 4 pytest-xdist workers sharing the GPU; the CUTLASS tests where .cutedsl/ is",
                     (*PYTEST[:-2], "-n", "4", "--dist", "loadfile", "--durations", "25", "tests/gpu"), 540, dsl=None),
    "tests-rerun-failed": Job("tests/gpu: only what tests-all failed, again, one at a time",
                              (*PYTEST[:-2], "--lf", "--lfnf", "none", "tests/gpu"), 300, dsl=None),
    "tests-core": Job("tests/gpu: kernels, Hopper templates, skinny shapes, compiled programs",
                      gpu_tests("test_gpu", "test_hopper_templates", "test_skinny_gpu", "test_compiled_gpu"), 400),
    "tests-hard": Job("tests/gpu: hard shapes (padded twins, kept padded storage), dynamic-M buckets",
                      gpu_tests("test_hard_shapes_gpu", "test_staging_gpu", "test_dynamic_gpu"), 400),
    "tests-api": Job("tests/gpu: the public API, fault isolation, preview templates, autocast, the store",
                     gpu_tests("test_api_gpu", "test_faults_gpu", "test_preview_templates", "test_autocast_gpu",
                               "test_share_kernels_gpu", "test_kernel_configs_gpu"), 500),
    "tests-dispatch": Job("tests/gpu: in-model check, patched layer, bound launches, Inductor, pipelined autotuning",
                          gpu_tests("test_in_model_gpu", "test_patch_fast_gpu", "test_bound_launch_gpu",
                                    "test_inductor_gpu", "test_pipeline_gpu"), 560),
    "tests-fp8": Job("tests/gpu: fp8 scaled_mm: eager, the Triton and TMA templates, Inductor, the fuzz cases",
                     gpu_tests("test_scaled_mm_gpu", "test_scaled_tma_gpu", "test_scaled_mm_inductor_gpu",
                               "test_fp8_fuzz_gpu"), 400),
    "tests-cutlass": Job("[DSL] tests/gpu: the CUTLASS operators' kernels, and a pick as Inductor's extern call",
                         gpu_tests("test_cutlass_operators_gpu", "test_inductor_extern_gpu"), 500, dsl=True),
    "compare-six": Job("bench/compare.py --no-inductor on six shapes",
                       script("compare", "--no-inductor", "--only", SIX_SHAPES), 300),
    **{f"compare-{k}of4": Job(f"bench/compare.py, part {k} of 4 of bench/shapes.json (then --merge)",
                              script("compare", "--part", f"{k}/4"), 590) for k in range(1, 5)},
    "compare-fp8": Job("bench/compare.py on four fp8 shapes, one also exhaustive",
                       script("compare", "--suite", "bench/shapes_fp8.json", "--only", FP8_SHAPES, "--exhaustive",
                              "llama3-8b-gate_up-m128-tensorwise", "--rounds", "20"), 420),
    "compare-cutlass": Job("[DSL] bench/compare.py --no-inductor on 3 shapes, the cutlass family pooled", script(
        "compare", "--no-inductor", "--only", "square-4096,square-8192,odd-4097", "--rounds", "20"), 400, dsl=True,
        env=(("GEMMTUNE_BACKENDS", "extern,triton,cutlass"),)),
    "fuzz-mm": Job("bench/fuzz.py --kind mm: 1000 problems, 12 processes",
                   script("fuzz", "--kind", "mm", "--cases", "1000", "--jobs", "12"), 560),
    "fuzz-fp8": Job("bench/fuzz.py --kind fp8: 200 problems", script("fuzz", "--kind", "fp8", "--cases", "200"), 560),
    **{f"models-{name}-{part}": Job(f"bench/models.py on {case}, the {part} part (first, then steady, on one machine)",
                                    script("models", "--cases", case, *(FIRST if part == "first" else STEADY)), 590)
       for name, case in (("stack1", "stack:1"), ("stack512", "stack:512"), ("llama64", "llama:64"))
       for part in ("first", "steady")},
    "serving": Job("bench/serving.py: the causal LM at every batch size, first calls and steady state",
                   script("serving"), 590),
    **{f"profile-{w}": Job(f"bench/profiling.py {w}", script("profiling", w), 300) for w in ("tune", "calls")},
    "first-use-check": Job("bench/redis_store.py --first-use with Triton picks", script(
        "redis_store", "--first-use", "--device", "cuda", "--backends", "triton", "--sizes", "256,1024,4096"), 300),
    "distributed-warmup": Job("bench/distributed_warmup.py --ranks 1,4: gloo on the host's CPUs", script(
        "distributed_warmup", "--ranks", "1,4", "--warm-numba", "--preload"), 240, env=(("CUDA_VISIBLE_DEVICES", ""),)),
    "cutlass-setup": Job("unpack the carried .whl/cutlass (bench/cutlass_wheels.py) into a new .cutedsl/",
                         timeout_s=120, unpack=True)}
PRESETS = {  # name: (lanes, what they run)
    "checks": (("tests-core,compare-six,profile-calls", "tests-api,tests-dispatch"), "the GPU tests on two GPUs"),
    "models": (("models-stack1-first,models-stack1-steady", "models-llama64-first,models-llama64-steady"),
               "the model protocol on the stack at M = 1 and the Llama at M = 64"),
    "fp8": (("tests-fp8,fuzz-fp8", "compare-fp8"), "the fp8 GPU tests, fuzz and comparison"),
    "cutlass": (("cutlass-setup,tests-cutlass,compare-cutlass",), "carry .whl/cutlass: set-up, tests, comparison")}


def unpack(log: TextIO) -> int:
    """Extract every wheel and .tar.xz of .whl/cutlass into a new .cutedsl/; report what imports."""
    src = ROOT / ".whl" / "cutlass"
    if not src.is_dir():
        log.write(f"error: {src.relative_to(ROOT)}/ is not here: carry it with this call\n")
        return 2
    shutil.rmtree(DSL, ignore_errors=True)
    DSL.mkdir()
    for wheel in sorted(src.glob("*.whl")):
        zipfile.ZipFile(wheel).extractall(DSL)
    for archive in sorted(src.glob("*.tar.xz")):
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(DSL, filter="tar")
    log.write(f"{DSL.name}: {sum(p.stat().st_size for p in DSL.rglob('*') if p.is_file()) / 2**20:.0f} MiB\n")
    env = _env(Job("", dsl=True), gpu=None)
    if subprocess.run([PY, "-c", "import cuda.bindings.driver, google.protobuf"], env=env, capture_output=True,
                      check=False).returncode:
        log.write("MISSING DEPS: cuda-bindings or protobuf does not import (cuda-bindings 13 needs a driver >= 580)\n")
    log.flush()
    return subprocess.run([PY, "-c", IMPORT_CHECK], env=env, stdout=log, stderr=subprocess.STDOUT,
                          check=False).returncode


def parse_lanes(args: Sequence[str]) -> list[list[str]]:
    """Lanes of job names from the command line: a preset expands to its lanes.

        >>> parse_lanes(["tests-core,compare-six", "tests-api"])
        [['tests-core', 'compare-six'], ['tests-api']]
    """
    lanes: list[list[str]] = []
    for arg in args:
        if arg in PRESETS:
            lanes.extend(lane.split(",") for lane in PRESETS[arg][0])
            continue
        names = [n for n in arg.split(",") if n]
        if (unknown := [n for n in names if n not in JOBS]) or not names:
            raise ValueError(f"unknown job {', '.join(unknown) or repr(arg)} (see --list)")
        lanes.append(names)
    return lanes


def count_gpus() -> int:
    """GPUs on this host (`nvidia-smi -L`); 0 where there is none."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def _env(job: Job, gpu: int | None) -> dict[str, str]:
    dsl = job.dsl or (job.dsl is None and DSL.is_dir())
    path = [str(DSL / "nvidia_cutlass_dsl" / "dsl_packages"), str(DSL)] if dsl else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([*path, str(ROOT / "src")])}
    if dsl:
        env.setdefault("CUTE_DSL_CACHE_DIR", str(DSL / "cache"))
    # the job's own variables last (a CPU-only job hides the GPUs)
    return {**env, **({} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)}), **dict(job.env)}


def run_job(name: str, job: Job, out: Path, gpu: int | None) -> str:
    """Run one job, its output in out/<name>.log; returns its outcome ("ok", "rc=N", "timed out", "skipped")."""
    with open(out / f"{name}.log", "w") as log:
        if job.dsl and not DSL.is_dir():
            log.write(f"skipped: no {DSL.name}/ (run cutlass-setup with .whl/cutlass carried)\n")
            return "skipped"
        try:
            rc = unpack(log) if job.unpack else subprocess.run(
                [a.format(out=out, job=name) for a in job.argv], cwd=ROOT, env=_env(job, gpu), stdout=log,
                stderr=subprocess.STDOUT, timeout=job.timeout_s, check=False).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\ntimed out after {job.timeout_s:.0f} s\n")
            return "timed out"
    return "ok" if rc == 0 else f"rc={rc}"


def plan(lanes: list[list[str]], gpus: int) -> list[tuple[int | None, list[str]]]:
    """(GPU, jobs) per lane: lane i on GPU i where every lane has a GPU, else all in turn on the default one.

        >>> plan([["a"], ["b"]], gpus=2), plan([["a"], ["b"]], gpus=1)
        ([(0, ['a']), (1, ['b'])], [(None, ['a']), (None, ['b'])])
    """
    apart = len(lanes) > 1 and gpus >= len(lanes)
    return [(i if apart else None, lane) for i, lane in enumerate(lanes)]


def run_lanes(lanes: list[list[str]], out: Path, gpus: int, tail: int = 12) -> int:
    """Run the lanes (at once where each has a GPU), then print each log's end; 1 if a job did not end ok."""
    out.mkdir(parents=True, exist_ok=True)
    placed, outcome, took = plan(lanes, gpus), {}, {}  # per job: "ok", "rc=N", "timed out" or "skipped"; its seconds

    def lane(gpu: int | None, names: list[str]) -> None:
        for name in names:
            t0 = time.perf_counter()
            outcome[name] = run_job(name, JOBS[name], out, gpu)
            took[name] = time.perf_counter() - t0
            print(f"{name}: {outcome[name]} in {took[name]:.0f} s", flush=True)

    with ThreadPoolExecutor(1 if placed[0][0] is None else len(placed)) as pool:  # one worker: one after the other
        list(pool.map(lambda p: lane(*p), placed))
    for gpu, names in placed:
        for name in names:
            print(f"==> {name} (GPU {'default' if gpu is None else gpu}): {outcome[name]} <== {took[name]:.0f} s")
            print("\n".join((out / f"{name}.log").read_text(errors="replace").splitlines()[-tail:]) if tail > 0 else "")
    return 0 if all(v in ("ok", "skipped") for v in outcome.values()) else 1


def describe(lanes: list[list[str]], out: Path, gpus: int) -> str:
    """The dry run: each lane's GPU and each job's command, one line each."""
    rows = []
    for i, (gpu, names) in enumerate(plan(lanes, gpus)):
        after = "" if gpu is not None or i == 0 else f" (after lane {i - 1})"
        rows.append(f"lane {i} on GPU {'default' if gpu is None else gpu}{after}")
        for name in names:
            job = JOBS[name]
            what = " ".join(a.format(out=out, job=name) for a in job.argv) if job.argv else job.doc
            rows.append(f"  {name}: {what}" + (f" [timeout {job.timeout_s:.0f} s]" if job.timeout_s else "")
                        + (" [DSL]" if job.dsl else ""))
    return "\n".join(rows)


def listing() -> str:
    """--list: every job and preset, one line each."""
    width = max(map(len, [*JOBS, *PRESETS]))
    jobs = [f"  {n:<{width}}  {j.doc}" for n, j in JOBS.items()]
    presets = [f"  {n:<{width}}  {' | '.join(lanes)}\n  {'':<{width}}  {d}" for n, (lanes, d) in PRESETS.items()]
    return "\n".join(["jobs:", *jobs, "presets (lanes separated by |):", *presets])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("lanes", nargs="*", help="one lane per argument: job names joined by commas, or a preset (--list)")
    p.add_argument("--list", action="store_true", help="print the jobs and presets")
    p.add_argument("--dry-run", action="store_true", help="print what would run on which GPU; run nothing")
    p.add_argument("--gpus", type=int, default=None, help="GPUs to assume (default: those nvidia-smi lists)")
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_out"), help="the logs' folder (default: $OUT, gpu_out)")
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
    if args.dry_run:
        print(describe(lanes, Path(args.out).resolve(), gpus))
        return 0
    return run_lanes(lanes, Path(args.out).resolve(), gpus)


if __name__ == "__main__":
    sys.exit(main())
