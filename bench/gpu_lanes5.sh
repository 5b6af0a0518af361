#!/usr/bin/env bash
# One device call on the two-GPU host, two lanes at once (logs and JSON to $OUT, or ./gpu_out):
#   lane A, GPU 0: bench/patch_overhead.py (where a patched layer's host time goes in the stack), then
#                  torch.compile max-autotune against Inductor fed with 1 and 2 fusion companions;
#   lane B, GPU 1: first runs and steady state of bench/models.py (plain max-autotune, fed Inductor,
#                  gemmtune warm-up), then the core GPU tests.
# Usage: bash bench/gpu_lanes5.sh
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
lane_a() {
  timeout 100 python bench/patch_overhead.py --m 64 --out "$out/patch_overhead.json" > "$out/patch_overhead.log" 2>&1
  timeout 330 python bench/model_rounds.py --m 128,64 --models stack \
    --variants inductor,inductor_gemmtune,inductor_gemmtune2 --rounds 15 --out "$out/rounds_fusion.json" \
    > "$out/rounds_fusion.log" 2>&1
}
lane_b() {
  timeout 300 python bench/models.py --m 16,128 --models stack --variants inductor,inductor_gemmtune,gemmtune \
    --iters 10 --out "$out/models_first_run.json" > "$out/models_first_run.log" 2>&1
  timeout 260 python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_skinny_gpu.py \
    tests/gpu/test_autocast_gpu.py > "$out/core_tests.log" 2>&1
}
. "$(dirname "$0")/two_lanes.sh"
run_lanes
