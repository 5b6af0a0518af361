#!/usr/bin/env bash
# One device call on the two-GPU host, two lanes at once (logs and JSON to $OUT, or ./gpu_out):
#   lane A, GPU 0: bench/model_rounds.py on the stack: eager against patched eager with the in-model
#                  check, without it, and with library picks only; then torch.compile max-autotune
#                  against Inductor fed by gemmtune, with and without fusion companions;
#   lane B, GPU 1: the GPU tests of the dispatch, the patch, the in-model check and Inductor.
# Usage: bash bench/gpu_lanes4.sh [M list for the eager rounds, default 64,16,1,128] [M list, compiled: 16,128]
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
eager_ms=${1:-64,16,1,128}
compiled_ms=${2:-16,128}
lane_a() {
  timeout 320 python bench/model_rounds.py --m "$eager_ms" --models stack \
    --variants eager,gemmtune,gemmtune_unchecked,gemmtune_library --rounds 15 --out "$out/rounds_eager.json" \
    > "$out/rounds_eager.log" 2>&1
  timeout 250 python bench/model_rounds.py --m "$compiled_ms" --models stack \
    --variants inductor,inductor_gemmtune,inductor_gemmtune_alone --rounds 15 --out "$out/rounds_inductor.json" \
    > "$out/rounds_inductor.log" 2>&1
}
lane_b() {
  timeout 560 python -m pytest -q -s -p no:cacheprovider tests/gpu/test_in_model_gpu.py tests/gpu/test_patch_fast_gpu.py \
    tests/gpu/test_bound_launch_gpu.py tests/gpu/test_inductor_gpu.py tests/gpu/test_compiled_gpu.py \
    tests/gpu/test_api_gpu.py > "$out/tests.log" 2>&1
}
. "$(dirname "$0")/two_lanes.sh"
run_lanes
