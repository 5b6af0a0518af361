#!/usr/bin/env bash
# One device call on the two-GPU host, two lanes at once (logs and JSON to $OUT, or ./gpu_out):
#   lane A, GPU 0: the bound-launch and patch GPU tests, bench/model_rounds.py (eager, patched,
#                  patched with library picks only), then the core GPU tests;
#   lane B, GPU 1: the CuTe DSL template (needs .whl/dsl carried): bench/cutlass_gpu.sh setup and
#                  test, then `gemmtune sweep` of its space (with the library kernels) on 7 shapes.
# Usage: bash bench/gpu_lanes.sh [M list for model_rounds, default 64,1,16,128]
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
ms=${1:-64,1,16,128}
CUTLASS_SHAPES=square-2048,square-4096,square-8192,odd-4097,llama3-8b-qkv-m4096,llama3-8b-o-m4096,llama3-8b-gate_up-m4096
lane_a() {
  timeout 100 python -m pytest -q -s -p no:cacheprovider tests/gpu/test_bound_launch_gpu.py tests/gpu/test_patch_fast_gpu.py > "$out/a_tests.log" 2>&1
  timeout 240 python bench/model_rounds.py --m "$ms" --models stack --variants eager,gemmtune,gemmtune_library --rounds 15 \
    --out "$out/rounds.json" > "$out/rounds.log" 2>&1
  timeout 230 python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_skinny_gpu.py \
    tests/gpu/test_compiled_gpu.py tests/gpu/test_inductor_gpu.py > "$out/b_tests.log" 2>&1
}
lane_b() {
  [ -d .whl/dsl ] || return 0
  { timeout 90 bash bench/cutlass_gpu.sh setup && timeout 120 bash bench/cutlass_gpu.sh test; } > "$out/cutlass.log" 2>&1
  ( D="$PWD/.cutedsl"; export PYTHONPATH="$D/nvidia_cutlass_dsl/dsl_packages:$D:$PWD/src" CUTE_DSL_CACHE_DIR="$D/cache"
    timeout 330 python -m gemmtune sweep --suite bench/shapes.json --only "$CUTLASS_SHAPES" --backends extern,cutlass \
      --out "$out/cutlass_sweep.jsonl" ) > "$out/cutlass_sweep.log" 2>&1
}
. "$(dirname "$0")/two_lanes.sh"
run_lanes 4
