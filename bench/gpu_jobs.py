"""The GPU runner's jobs and presets (`bench/gpu_run.py` runs them): each job a command line (`{out}` the
output folder, `{job}` its name) with a timeout, or the unpacking of a carried folder of wheels.

    python bench/gpu_run.py --list      # every job and preset, one line each
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PYTEST = (PY, "-m", "pytest", "-q", "-p", "no:cacheprovider")


def gpu_tests(*names: str, show: bool = False) -> tuple[str, ...]:
    """pytest over tests/gpu/<name>.py (with -s: the tests' own prints reach the log)."""
    return (*PYTEST, *(["-s"] if show else []), *(f"tests/gpu/{n}.py" for n in names))


@dataclass(frozen=True)
class Job:
    """One step of a lane: a command (`{out}` is the output folder), or `unpack`: the carried folder
    .whl/<unpack> unpacked into .cutedsl/ (`gpu_run.unpack`)."""

    doc: str
    argv: tuple[str, ...] = ()
    timeout_s: float | None = None
    dsl: bool | None = False  # True: runs with .cutedsl/ on the path, skipped without it; None: on the path if there
    env: tuple[tuple[str, str], ...] = ()
    unpack: str | None = None




CUTLASS_SHAPES = ("square-2048,square-4096,square-8192,odd-4097,llama3-8b-qkv-m4096,llama3-8b-o-m4096,"
                  "llama3-8b-gate_up-m4096")
COMPARE_CUTLASS = (PY, "bench/compare.py", "--no-inductor", "--only", "square-4096,square-8192,odd-4097,llama3-8b-qkv-m4096",
                   "--rounds", "20")
FP8_SHAPES = ("llama3-8b-q_o-m16-rowwise,llama3-8b-gate_up-m128-tensorwise,llama3-8b-down-m1024-rowwise,"
              "llama3-70b-q_o-m8192-tensorwise")
FP8_EXHAUSTIVE = "llama3-8b-gate_up-m128-tensorwise,llama3-8b-down-m1024-rowwise"
FP8_MORE = ("llama3-8b-q_o-m16-tensorwise,llama3-8b-kv-m128-rowwise,llama3-8b-gate_up-m1024-rowwise,"
            "llama3-8b-down-m8192-tensorwise,llama3-70b-gate_up-m16-rowwise,llama3-70b-down-m128-tensorwise,"
            "llama3-70b-kv-m1024-tensorwise,llama3-70b-q_o-m8192-rowwise")


FP8_SWEEP = ",".join(f"llama3-8b-{p}-m{m}-{s}" for p in ("q_o", "kv", "gate_up", "down") for m in (16, 128)
                     for s in ("tensorwise", "rowwise"))
FP8_INDUCTOR = ("llama3-8b-q_o-m16-tensorwise,llama3-8b-kv-m16-rowwise,llama3-8b-gate_up-m16-rowwise,"
                "llama3-70b-q_o-m16-rowwise,llama3-70b-gate_up-m16-tensorwise,llama3-8b-kv-m128-rowwise,"
                "llama3-70b-down-m128-rowwise,llama3-8b-q_o-m1024-tensorwise")
FP8_SWEEP_M16 = ",".join(f"llama3-8b-{p}-m16-{s}" for p in ("q_o", "kv", "gate_up", "down")
                         for s in ("tensorwise", "rowwise"))
FP8_M16_INDUCTOR = ("llama3-8b-q_o-m16-rowwise,llama3-8b-q_o-m16-tensorwise,llama3-8b-kv-m16-rowwise,"
                    "llama3-8b-kv-m16-tensorwise,llama3-8b-gate_up-m16-rowwise,llama3-70b-q_o-m16-rowwise,"
                    "llama3-70b-gate_up-m16-tensorwise,llama3-70b-down-m16-rowwise")
FP8_INDUCTOR_2 = ("llama3-8b-kv-m16-tensorwise,llama3-70b-down-m16-rowwise,llama3-70b-q_o-m128-tensorwise,"
                  "llama3-8b-gate_up-m1024-tensorwise,llama3-70b-kv-m1024-rowwise,llama3-8b-down-m8192-rowwise")
FP8_18 = (*FP8_SHAPES.split(","), *FP8_INDUCTOR.split(","), *FP8_INDUCTOR_2.split(","))  # Inductor's 18 fp8 shapes


def _fp8_rest() -> str:
    """The fp8 suite's shapes that neither compare-fp8 nor compare-fp8-library measures."""
    done = set(FP8_SHAPES.split(",")) | set(FP8_MORE.split(","))
    names = [s["name"] for s in json.loads((ROOT / "bench" / "shapes_fp8.json").read_text())["shapes"]]
    return ",".join(n for n in names if n not in done)


SIX_SHAPES = "square-2048,square-8192,odd-4097,llama3-8b-qkv-m1,llama3-8b-o-m16,llama3-8b-gate_up-m128"


def _rounds(ms: str, variants: str, models: str = "stack") -> tuple[str, ...]:
    return (PY, "bench/model_rounds.py", "--m", ms, "--models", models, "--variants", variants, "--rounds", "15",
            "--out", "{out}/{job}.json")


PROTOCOL_FIRST = ("default,max_autotune,max_autotune_again,gemmtune,gemmtune_store,gemmtune_again,eager_warmup,"
                  "eager_warmup_store,eager_warmup_shared,eager_warmup_shared_store")
def _fp8_compare(only: str, rounds: str, *flags: str) -> tuple[str, ...]:
    """bench/compare.py on the fp8 suite's shapes `only`, `rounds` rounds, with `flags` (e.g. --no-inductor)."""
    return (PY, "bench/compare.py", "--suite", "bench/shapes_fp8.json", *flags, "--only", only, "--rounds", rounds,
            "--out", "{out}/{job}.json")


def _fp8_sweep(only: str) -> tuple[str, ...]:
    """`gemmtune sweep` of the fp8 suite's shapes `only`, every candidate timed."""
    return PY, "-m", "gemmtune", "sweep", "--suite", "bench/shapes_fp8.json", "--only", only, "--out", "{out}/{job}.jsonl"


PROTOCOL_ROOT = "/tmp/gemmtune-protocol"  # the caches a case's first calls leave for its steady state


def _protocol(case: str, part: str = "all") -> tuple[str, ...]:
    """bench/models.py's protocol on one case, its caches under PROTOCOL_ROOT: `part` "first" (every
    first call but the compile warm-up's), "steady" (the steady state of those first calls, a training
    step, 31 rounds of 20 calls, the GPU time by kernel kind) or "all" (both, one invocation)."""
    first = PROTOCOL_FIRST if part != "steady" else ""
    steady = ("--steady", "eager,eager_warmup,default,max_autotune,gemmtune", "--train", "--kernels") \
        if part != "first" else ("--steady", "")
    return (PY, "bench/models.py", "--cases", case, "--first", first, *steady, "--rounds", "31", "--iters", "20",
            "--root", PROTOCOL_ROOT, "--out", "{out}/{job}.json")


JOBS: dict[str, Job] = {
    # the GPU tests
    "tests-core": Job("tests/gpu: kernels, Hopper templates, skinny shapes, compiled programs",
                      gpu_tests("test_gpu", "test_hopper_templates", "test_skinny_gpu", "test_compiled_gpu")),
    "tests-api": Job("tests/gpu: the public API, fault isolation, preview templates",
                     gpu_tests("test_api_gpu", "test_faults_gpu", "test_preview_templates")),
    "tests-dispatch": Job("tests/gpu: in-model check, patched layer, bound launches, Inductor, compiled, API",
                          gpu_tests("test_in_model_gpu", "test_patch_fast_gpu", "test_bound_launch_gpu",
                                    "test_inductor_gpu", "test_compiled_gpu", "test_api_gpu", show=True), 560),
    "tests-patch": Job("tests/gpu: the patched layer's warm path, the in-model check, compiled patched models",
                       gpu_tests("test_patch_fast_gpu", "test_in_model_gpu", "test_compiled_gpu"), 300),
    "tests-warmup": Job("tests/gpu: warm-up, patched layer, isolation faults, API, compiled paths",
                        gpu_tests("test_in_model_gpu", "test_patch_fast_gpu", "test_faults_gpu", "test_api_gpu",
                                  "test_compiled_gpu"), 300),
    "tests-all": Job("tests/gpu, all of it, 4 pytest-xdist workers sharing the GPU (a file per worker); the "
                     "CuTe DSL tests too where .cutedsl/ is there", (*PYTEST[:-2], "-n", "4", "--dist", "loadfile",
                                                                     "--durations", "25", "tests/gpu"), 540, dsl=None),
    "tests-rerun-failed": Job("tests/gpu: only what tests-all failed, again, one at a time (timing checks that "
                              "sharing the GPU disturbed)", (*PYTEST[:-2], "--lf", "--lfnf", "none", "tests/gpu"),
                              300, dsl=None),
    "tests-fp8": Job("tests/gpu/test_scaled_mm_gpu.py: fp8 scaled_mm, eager and the Triton template",
                     gpu_tests("test_scaled_mm_gpu", show=True), 240),
    "tests-scaled-tma": Job("tests/gpu/test_scaled_tma_gpu.py and test_fp8_fuzz_gpu.py: the persistent TMA fp8 "
                            "preview template, and the fuzz cases of the last fixes",
                            gpu_tests("test_scaled_tma_gpu", "test_fp8_fuzz_gpu", "test_scaled_mm_gpu"), 300),
    "fp8-fuzz": Job("bench/fp8_fuzz.py: 200 seeded fp8 problems through the pool's kernels, gemmtune and torch",
                    (PY, "bench/fp8_fuzz.py", "--device", "cuda", "--cases", "200", "--out", "{out}/{job}.json"), 560),
    "tests-autocast": Job("tests/gpu: kernels, skinny shapes, autocast",
                          gpu_tests("test_gpu", "test_skinny_gpu", "test_autocast_gpu"), 260),
    # benchmarks (docs/MODELS.md, docs/PERFORMANCE.md, docs/INDUCTOR.md)
    "compare-six": Job("bench/compare.py --no-inductor on six public shapes",
                       (PY, "bench/compare.py", "--no-inductor", "--only", SIX_SHAPES, "--out", "{out}/{job}.json")),
    "compare-fp8": Job("bench/compare.py on the fp8 suite: torch._scaled_mm, gemmtune and Inductor max-autotune",
                       _fp8_compare(FP8_SHAPES, "20", "--exhaustive", FP8_EXHAUSTIVE), 420),
    "compare-fp8-library": Job("bench/compare.py --no-inductor on the rest of the fp8 suite",
                               _fp8_compare(FP8_MORE, "20", "--no-inductor"), 300),
    "compare-fp8-rest": Job("bench/compare.py --no-inductor on the fp8 suite's other 52 shapes, 10 rounds (JSON "
                            "written after each shape)", _fp8_compare(_fp8_rest(), "10", "--no-inductor"), 330),
    "compare-fp8-inductor": Job("bench/compare.py on 8 more fp8 shapes with Inductor max-autotune beside "
                                "cuBLASLt and gemmtune, 10 rounds",
                                _fp8_compare(FP8_INDUCTOR, "10"), 540),
    "compare-fp8-inductor-2": Job("bench/compare.py on 6 more fp8 shapes (M = 16 to 8192) with Inductor "
                                  "max-autotune beside cuBLASLt and gemmtune, 10 rounds",
                                  _fp8_compare(FP8_INDUCTOR_2, "10"), 440),
    "fp8-sweep": Job("gemmtune sweep of the fp8 suite's Llama-3-8B shapes at M = 16 and 128 (16 problems)",
                     _fp8_sweep(FP8_SWEEP), 540),
    "interleave-probe": Job("bench/interleave_probe.py: torch._scaled_mm's host and GPU readings among 2-249 "
                            "interleaved choices, beside its reading alone",
                            (PY, "bench/interleave_probe.py", "--out", "{out}/{job}.json"), 300),
    "layer-host-cost": Job("bench/layer_host_cost.py: host microseconds per call of one nn.Linear, plain and "
                           "patched (a decided size), at 1x64x64",
                           (PY, "bench/layer_host_cost.py", "--shape", "1x64x64", "--out", "{out}/{job}.json"), 120),
    "fp8-sweep-m16-rounds": Job("gemmtune sweep of the fp8 suite's Llama-3-8B shapes at M = 16 (8 problems), "
                                "every correct choice then re-timed in 10 interleaved rounds (--rounds 10): "
                                "readings a replay can rank by", (*_fp8_sweep(FP8_SWEEP_M16), "--rounds", "10"), 560),
    "fp8-sweep-m16": Job("gemmtune sweep of the fp8 suite's Llama-3-8B shapes at M = 16 (8 problems), the skinny "
                         "configs in the space", _fp8_sweep(FP8_SWEEP_M16), 400),
    "compare-fp8-18": Job("bench/compare.py on the first 9 of the 18 fp8 shapes of compare-fp8, "
                          "compare-fp8-inductor and compare-fp8-inductor-2, Inductor max-autotune beside cuBLASLt "
                          "and gemmtune, 20 rounds (an H100 ran 14 in 580 s; compare-fp8-18b has the rest: run the "
                          "two in two calls on one machine, then merge with bench/compare.py --merge)",
                          _fp8_compare(",".join(FP8_18[:9]), "20"), 420),
    "compare-fp8-18b": Job("bench/compare.py on the last 9 of the 18 fp8 shapes of compare-fp8-18, Inductor "
                           "max-autotune beside cuBLASLt and gemmtune, 20 rounds",
                           _fp8_compare(",".join(FP8_18[9:]), "20"), 420),
    "compare-fp8-narrow": Job("bench/compare.py on the fp8 shapes that get the narrow configs (M = 128, N = 1024), "
                              "Inductor max-autotune beside cuBLASLt and gemmtune, 40 rounds",
                              _fp8_compare("llama3-8b-kv-m128-rowwise,llama3-8b-kv-m128-tensorwise,"
                                           "llama3-70b-kv-m128-rowwise,llama3-70b-kv-m128-tensorwise", "40"), 360),
    "compare-fp8-m16": Job("bench/compare.py on the 8 fp8 shapes at M = 16 that Inductor ran on before, Inductor "
                           "max-autotune beside cuBLASLt and gemmtune, 40 rounds (1 % of a 10 us kernel)",
                           _fp8_compare(FP8_M16_INDUCTOR, "40"), 540),
    "compare-fp8-preview": Job("bench/compare.py --no-inductor on the fp8 shapes of compare-fp8, the persistent "
                               "TMA preview template in the pool (GEMMTUNE_PREVIEW_TEMPLATES=1)",
                               _fp8_compare(FP8_SHAPES, "20", "--no-inductor"), 300,
                               env=(("GEMMTUNE_PREVIEW_TEMPLATES", "1"),)),
    "fp8-accum-probe": Job("bench/fp8_accum_probe.py: each fp8 kernel's accumulation error with a float32 output, "
                           "tensor cores' partial sums promoted every 128 and every 32 elements of K",
                           (PY, "bench/fp8_accum_probe.py", "--out", "{out}/{job}.json"), 240),
    "fp8-call-probe": Job("bench/fp8_call_probe.py: one cuBLASLt kernel by each call path, two timers",
                          (PY, "bench/fp8_call_probe.py", "--suite", "bench/shapes_fp8.json", "--only",
                           "llama3-8b-down-m8192-tensorwise,"
                           "llama3-8b-gate_up-m1024-rowwise", "--out", "{out}/{job}.json"), 120),
    "tests-fixed": Job("tests/gpu: the files the last full run failed in, and those the fixes touch",
                       gpu_tests("test_cutlass_operators_gpu", "test_scaled_mm_inductor_gpu"), 300, dsl=None),
    "distributed-warmup": Job("bench/distributed_warmup.py --ranks 1,4 --warm-numba: gloo on the CPUs, no GPU",
                              (PY, "bench/distributed_warmup.py", "--ranks", "1,4", "--warm-numba", "--profile",
                               "--out", "{out}/{job}.json"), 240, env=(("CUDA_VISIBLE_DEVICES", ""),)),
    "distributed-warmup-preload": Job("bench/distributed_warmup.py --ranks 1,4 --warm-numba --preload: each rank's CPU "
                                      "backends loaded before the timed warm-up", (PY, "bench/distributed_warmup.py",
                                                                                   "--ranks", "1,4", "--warm-numba",
                                                                                   "--preload", "--out",
                                                                                   "{out}/{job}.json"), 240,
                                      env=(("CUDA_VISIBLE_DEVICES", ""),)),
    "distributed-warmup-shared": Job("bench/distributed_warmup.py --ranks 1,4 --warm-numba --share-cores: each rank "
                                     "its share of numba's threads", (PY, "bench/distributed_warmup.py", "--ranks",
                                                                      "1,4", "--warm-numba", "--share-cores", "--out",
                                                                      "{out}/{job}.json"), 240,
                                     env=(("CUDA_VISIBLE_DEVICES", ""),)),
    "compiled-overhead": Job("bench/compiled_overhead.py", (PY, "bench/compiled_overhead.py", "--out", "{out}/{job}.json")),
    "eager-probe": Job("bench/eager_probe.py --m 64", (PY, "bench/eager_probe.py", "--m", "64", "--out", "{out}/{job}.json")),
    "patch-overhead": Job("bench/patch_overhead.py --m 64: where a patched layer's host time goes",
                          (PY, "bench/patch_overhead.py", "--m", "64", "--out", "{out}/{job}.json"), 100),
    "rounds-eager": Job("bench/model_rounds.py: eager against patched eager, and with library picks only",
                        _rounds("64,16,1,128", "eager,gemmtune,gemmtune_library"), 240),
    "rounds-check": Job("bench/model_rounds.py: patched eager with and without the in-model check",
                        _rounds("64,16,1,128", "eager,gemmtune,gemmtune_unchecked,gemmtune_library"), 320),
    "rounds-release": Job("bench/model_rounds.py: patched eager with release=True among the variants",
                          _rounds("1,16,64,128", "eager,gemmtune,gemmtune_release,gemmtune_library"), 260),
    "rounds-inductor": Job("bench/model_rounds.py: max-autotune against Inductor fed by gemmtune",
                           _rounds("16,128", "inductor,inductor_gemmtune,inductor_gemmtune_alone"), 250),
    "rounds-fusion": Job("bench/model_rounds.py: Inductor fed with 1 and 2 fusion companions",
                         _rounds("128,64", "inductor,inductor_gemmtune,inductor_gemmtune2"), 330),
    "rounds-llama": Job("bench/model_rounds.py: the transformers Llama model, eager against patched eager",
                        _rounds("64,1", "eager,gemmtune,gemmtune_library", models="llama"), 200),
    "models-stack1": Job("bench/models.py: the protocol on the stack at M = 1, training step and kernel split",
                         _protocol("stack:1"), 590),
    "models-stack512": Job("bench/models.py: the protocol on the stack at M = 512, training step and kernel split",
                           _protocol("stack:512"), 590),
    "models-llama64": Job("bench/models.py: the protocol on the transformers Llama at M = 64, training step and "
                          "kernel split", _protocol("llama:64"), 590),
    **{f"models-{name}-{part}": Job(f"bench/models.py: the protocol on {case}, {part} part only (caches under "
                                    f"{PROTOCOL_ROOT}: the steady part times the first part's calls, in one machine)",
                                    _protocol(case, part), 590)
       for name, case in (("stack1", "stack:1"), ("stack512", "stack:512"), ("llama64", "llama:64"))
       for part in ("first", "steady")},
    "warm-store-profile": Job("bench/warmup_profile.py: eager warm-ups from a warm store with new Triton caches, "
                              "under cProfile (the Llama at M = 64, the stack at M = 1)",
                              (PY, "-c", "import subprocess, sys; sys.exit(max(subprocess.call([sys.executable, "
                               "'bench/warmup_profile.py', '--model', mdl, '--cases', c, '--out', "
                               "'{out}/warm-store-profile-' + mdl + '.json']) for mdl, c in "
                               "(('llama', '64,64+warm+cprofile'), ('stack', '1,1+warm+cprofile'))))"), 200),
    "warm-store-stack1": Job("bench/warmup_profile.py: the stack's eager warm-up at M = 1, cold then from its store "
                             "with new Triton caches", (PY, "bench/warmup_profile.py", "--model", "stack", "--cases",
                                                        "1,1+warm", "--out", "{out}/{job}.json"), 120),
    "bytecode": Job("python -m compileall src/gemmtune: gemmtune's bytecode written, as a pip install writes it "
                    "(the GPU machine sets PYTHONDONTWRITEBYTECODE=1, so each process there compiled gemmtune's "
                    "sources: 0.32 s of a warm-up); put it first in a lane that times a warm-up",
                    (PY, "-m", "compileall", "-q", "src/gemmtune"), 120),
    "warm-store-shared": Job("bench/warmup_profile.py: the stack's eager warm-up at M = 1, cold then from its store "
                             "with new Triton caches, the picks' kernels kept in the store (share_kernels)",
                             (PY, "bench/warmup_profile.py", "--model", "stack", "--cases",
                              "1,1+warm,1+warm+host,1+warm+cprofile",
                              "--out", "{out}/{job}.json"), 150, env=(("GEMMTUNE_SHARE_KERNELS", "1"),)),
    "warm-store-shared-llama": Job("bench/warmup_profile.py: the transformers Llama's eager warm-up at M = 64, cold "
                                   "then from its store with new Triton caches, kernels in the store (share_kernels)",
                                   (PY, "bench/warmup_profile.py", "--model", "llama", "--cases", "64,64+warm,64+warm+host",
                                    "--out", "{out}/{job}.json"), 150, env=(("GEMMTUNE_SHARE_KERNELS", "1"),)),
    "tests-store": Job("tests/gpu: kernels shared through the store, and the in-model check's kept verdicts",
                       gpu_tests("test_share_kernels_gpu", "test_in_model_gpu", show=True), 300),
    "tests-configs": Job("tests/gpu/test_kernel_configs_gpu.py: reduction configs from the store on new Inductor "
                         "and Triton caches", gpu_tests("test_kernel_configs_gpu", show=True), 300),
    "models-stack1-store": Job("bench/models.py: first calls on the stack at M = 1: default, gemmtune cold, on a warm "
                               "store (new Inductor and Triton caches) and a second start",
                               (PY, "bench/models.py", "--cases", "stack:1", "--first",
                                "default,gemmtune,gemmtune_store,gemmtune_again", "--steady", "",
                                "--out", "{out}/{job}.json"), 420),
    "profile-stack1-store": Job("bench/models.py: the stack's first calls at M = 1 under cProfile (default, gemmtune "
                                "cold, warm store; BENCH_PROFILE_DIR)",
                                ("env", "BENCH_PROFILE_DIR={out}/profile", PY, "bench/models.py", "--cases",
                                 "stack:1", "--first", "default,gemmtune,gemmtune_store", "--steady", "",
                                 "--out", "{out}/{job}.json"), 420),
    "tests-pipeline": Job("tests/gpu/test_pipeline_gpu.py: a graph's new problems timed together by Inductor's "
                          "pipelined autotuning (install(pipeline=True)), in a script without a __main__ guard",
                          gpu_tests("test_pipeline_gpu", show=True), 300),
    "models-pipeline": Job("bench/models.py: first calls with each new problem timed while lowered against a "
                           "graph's problems timed together (install(pipeline=True)), and their steady state",
                           (PY, "bench/models.py", "--cases", "stack:512,llama:64", "--first",
                            "default,gemmtune,gemmtune_pipeline,gemmtune_pipeline_store", "--steady",
                            "default,gemmtune,gemmtune_pipeline", "--rounds", "15", "--iters", "20",
                            "--out", "{out}/{job}.json"), 560),
    "first-use-check": Job("bench/first_use_check.py: the first-use check's cost per Triton pick from a shared store",
                           (PY, "bench/first_use_check.py", "--device", "cuda", "--backends", "triton", "--sizes",
                            "256,1024,4096", "--out", "{out}/{job}.json"), 300),
    "tests-share": Job("tests/gpu/test_share_kernels_gpu.py: a pick's kernels from the store on a new Triton cache",
                       gpu_tests("test_share_kernels_gpu", show=True), 240),
    "kernels-stack512": Job("bench/models.py: the steady state alone on the stack at M = 512, with the "
                                  "kernel split (every variant compiled in that process)",
                                  (PY, "bench/models.py", "--cases", "stack:512", "--first", "", "--steady",
                                   "default,max_autotune,gemmtune", "--kernels", "--rounds", "31", "--iters", "20",
                                   "--out", "{out}/{job}.json"), 300),
    "steady-stack512": Job("bench/models.py: the steady state alone on the stack at M = 512, the eager variants "
                           "(warm-up releasing torch's layers and keeping them patched, paired with plain eager) beside the compiled "
                           "ones, training step and kernel split (every variant compiled in that process)",
                           (PY, "bench/models.py", "--cases", "stack:512", "--first", "", "--steady",
                            "eager,eager_warmup,eager_warmup_patched,default,max_autotune,gemmtune", "--train",
                            "--kernels", "--rounds", "31", "--iters", "20", "--out", "{out}/{job}.json"), 300),
    "steady-eager": Job("bench/models.py: plain eager against gemmtune.warmup then eager, releasing torch's "
                        "layers (the default) and with release=False, against plain eager on other copies (the A/A controls: one made before "
                        "the warm-ups, one after), and against forwards calling F.linear on the instance or on "
                        "a subclass (no gemmtune) or with the released layer's forward on a copy never warmed up, paired per round, 401 rounds of 4 forwards, each variant on 4 "
                        "copies called in turn, on the stack at M = 1 and the Llama at M = 64",
                        (PY, "bench/models.py", "--cases", "stack:1,llama:64", "--first", "", "--steady",
                         "eager,eager_copy,eager_closure,eager_subclass,eager_lean,eager_warmup,eager_warmup_patched,"
                         "eager_late", "--rounds", "401", "--iters", "4", "--copies", "4", "--out",
                         "{out}/{job}.json"), 420),
    "steady-eager-512": Job("bench/models.py: steady-eager's protocol on the stack at M = 512 (plain eager, its "
                            "A/A copies, warm-up releasing or keeping layers patched), 201 rounds of 4 forwards",
                            (PY, "bench/models.py", "--cases", "stack:512", "--first", "", "--steady",
                             "eager,eager_copy,eager_warmup,eager_warmup_patched,eager_late", "--rounds", "201",
                             "--iters", "4", "--copies", "4", "--out", "{out}/{job}.json"), 400),
    "kernels-stack1": Job("bench/models.py: the steady state alone on the stack at M = 1, with the kernel split "
                          "and the top kernels (every variant compiled in that process)",
                          (PY, "bench/models.py", "--cases", "stack:1", "--first", "", "--steady",
                           "default,max_autotune,gemmtune,gemmtune_gemv", "--kernels", "--rounds", "31", "--iters",
                           "20", "--out", "{out}/{job}.json"), 400),
    "host-stack1": Job("bench/host_probe.py: where the compiled forward's host time goes on the stack at M = 1 "
                       "(output code, guards, host time in shuffled rounds, cProfile), every variant in one process",
                       (PY, "bench/host_probe.py", "--case", "stack:1", "--out", "{out}/{job}.json"), 300),
    "host-stack1-train": Job("bench/host_probe.py --train: the training step on the stack at M = 1, max-autotune "
                             "and default against gemmtune's default-mode compile (handler counts, what it built, output code, "
                             "kernel split)", (PY, "bench/host_probe.py", "--case", "stack:1", "--train", "--variants",
                                               "max_autotune,default,gemmtune", "--rounds", "15", "--iters", "10",
                                               "--profile-calls", "20", "--out", "{out}/{job}.json"), 400),
    "host-stack512-train": Job("bench/host_probe.py --train on the stack at M = 512: max-autotune and default against "
                               "gemmtune's default-mode compile, training step", (PY, "bench/host_probe.py", "--case",
                               "stack:512", "--train", "--variants", "max_autotune,default,gemmtune", "--rounds", "15",
                               "--iters", "10", "--profile-calls", "20", "--out", "{out}/{job}.json"), 300),
    "host-llama64-train": Job("bench/host_probe.py --train on the transformers Llama at M = 64: max-autotune and "
                              "default against gemmtune's default-mode compile, training step", (PY, "bench/host_probe.py",
                              "--case", "llama:64", "--train", "--variants", "max_autotune,default,gemmtune", "--rounds",
                              "15", "--iters", "10", "--profile-calls", "20", "--out", "{out}/{job}.json"), 300),
    "prologue-steady": Job("bench/models.py: the steady state alone, stack M = 512 and the Llama at M = 64, with "
                           "gemmtune_noprologue (Inductor's prologue fusion off) beside the others, kernel split",
                           (PY, "bench/models.py", "--cases", "stack:512,llama:64", "--first", "", "--steady",
                            "default,max_autotune,gemmtune,gemmtune_noprologue", "--kernels", "--rounds", "31",
                            "--iters", "20", "--out", "{out}/{job}.json"), 420),
    "first-runs": Job("bench/warmup_profile.py: first runs in fresh processes beside max-autotune",
                      (PY, "bench/warmup_profile.py", "--cases", "1+inductor,16+inductor,64+inductor,128+inductor",
                       "--out", "{out}/{job}.json"), 330),
    "fed-first-runs": Job("bench/warmup_profile.py: Inductor fed by gemmtune, cold store then kept",
                          (PY, "bench/warmup_profile.py", "--cases",
                           "16+inductor+fed,16+fed+warm,128+inductor+fed,128+fed+warm", "--out", "{out}/{job}.json"), 240),
    # the CuTe DSL template (docs/CUTLASS.md)
    "cutlass-setup": Job("unpack the carried .whl/dsl into .cutedsl/", timeout_s=90, unpack="dsl"),
    "cutlass-all-setup": Job("unpack the carried .whl/cutlass (bench/cutlass_wheels.py: the DSL and the operators "
                             "library in one pack) into .cutedsl/", timeout_s=120, unpack="cutlass"),
    "cutlass-deps": Job("add the carried .whl/deps to .cutedsl/", unpack="deps"),
    "cutlass-ops-setup": Job("add the carried .whl/ops (nvidia-cutlass-operators) to .cutedsl/", timeout_s=90,
                             unpack="ops"),
    "cutlass-ops-test": Job("[DSL] tests/gpu/test_cutlass_operators_gpu.py: the library's operators, mm and addmm",
                            (*PYTEST, "-s", "-x", "tests/gpu/test_cutlass_operators_gpu.py"), 400, dsl=True),
    "cutlass-ops-direct": Job("[DSL] tests/gpu/test_cutlass_operators_gpu.py -k direct: the compiled kernel called "
                              "with the tensors against the library's run, and each one's host time per call",
                              (*PYTEST, "-s", "-k", "direct", "tests/gpu/test_cutlass_operators_gpu.py"), 300, dsl=True),
    "cutlass-ops-bench": Job("[DSL] bench/cutlass_operators.py: compile s, run time, cuBLAS, per operator",
                             (PY, "bench/cutlass_operators.py", "--out", "{out}/{job}.json"), 560, dsl=True),
    "cutlass-ops-quick": Job("[DSL] bench/cutlass_operators.py on 8192^3 and Llama-3-8B gate_up at M = 4096, no tile "
                             "orders", (PY, "bench/cutlass_operators.py", "--shapes", "square-8192,llama3-8b-gate_up-m4096",
                                        "--no-orders", "--reps", "30", "--out", "{out}/{job}.json"), 300, dsl=True),
    "cutlass-sweep": Job("[DSL] gemmtune sweep of the cutlass family with the library kernels, 7 shapes",
                         (PY, "-m", "gemmtune", "sweep", "--suite", "bench/shapes.json", "--only", CUTLASS_SHAPES,
                          "--backends", "extern,cutlass", "--out", "{out}/{job}.jsonl"), 330, dsl=True),
    "compare-without-cutlass": Job("bench/compare.py on 4 shapes, the default pool",
                                   (*COMPARE_CUTLASS, "--out", "{out}/{job}.json"), 150),
    "compare-default-cutlass": Job("[DSL] bench/compare.py on 4 shapes, the default pool with the operators library "
                                   "installed (cutlass_operators pooled at 2048 and more), exhaustive on two",
                                   (*COMPARE_CUTLASS, "--exhaustive", "odd-4097,square-8192", "--out",
                                    "{out}/{job}.json"), 420, dsl=True),
    "compare-shortlist-cutlass": Job("[DSL] bench/compare.py on 4 shapes, the default pool with the operators' "
                                     "shortlist, exhaustive on square-8192",
                                     (*COMPARE_CUTLASS, "--exhaustive", "square-8192", "--out", "{out}/{job}.json"),
                                     330, dsl=True),
    "extern-cutlass": Job("[DSL] bench/extern_call.py: a CUTLASS pick in a default-mode compile as gemmtune's "
                          "extern kernel, per-call GPU and host time against a plain compile and torch.mm",
                          (PY, "bench/extern_call.py", "--out", "{out}/{job}.json"), 300, dsl=True),
    "extern-test": Job("[DSL] tests/gpu/test_inductor_extern_gpu.py: a CUTLASS pick built by a compile as the "
                       "extern call", (*PYTEST, "-s", "tests/gpu/test_inductor_extern_gpu.py"), 240, dsl=True),
    "compare-with-cutlass": Job("[DSL] bench/compare.py on 4 shapes, the cutlass family in the pool",
                                (*COMPARE_CUTLASS, "--out", "{out}/{job}.json"), 300, dsl=True,
                                env=(("GEMMTUNE_BACKENDS", "extern,triton,cutlass"),)),
}
PRESETS: dict[str, tuple[str, ...]] = {
    "checks": ("tests-core,compare-six,compiled-overhead,eager-probe", "tests-api"),
    "warmup": ("first-runs,fed-first-runs", "rounds-release,tests-warmup"),
    "rounds": ("rounds-eager,patch-overhead,rounds-inductor", "tests-dispatch,rounds-llama"),
    "cutlass": ("cutlass-all-setup,cutlass-ops-test,cutlass-sweep", "compare-without-cutlass,compare-shortlist-cutlass"),
    "cutlass-ops": ("cutlass-ops-setup,cutlass-ops-test,cutlass-ops-bench",),
    "open-1": ("tests-fp8,compare-fp8-narrow,steady-eager",),
    "open-2": ("compare-fp8-18,compare-fp8-18b",),
}
PRESET_DOCS = {
    "checks": "the GPU tests over two GPUs; on GPU 0 also the six-shape comparison and the dispatch probes",
    "warmup": "first runs in fresh processes and fed Inductor | release rounds and the warm-up GPU tests",
    "rounds": "eager and Inductor rounds, host time per layer | the dispatch GPU tests and the Llama rounds",
    "cutlass": "carry .whl/cutlass: set-up, GPU tests and sweep of the operators | compare without and with them",
    "cutlass-ops": "after cutlass-setup, carry .whl/ops: the operators library's set-up, GPU tests and benchmark",
    "open-1": "what the open issues still need, one call (about 5 min on an H100): the fp8 GPU tests, the narrow "
              "configs against Inductor, the eager target's rounds",
    "open-2": "what the open issues still need, a second call (about 6 min on an H100): the 18 fp8 shapes "
              "against cuBLASLt and Inductor (merge the two JSON files with bench/compare.py --merge)",
}
