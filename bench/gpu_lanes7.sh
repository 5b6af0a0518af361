#!/usr/bin/env bash
# One device call, two lanes (two GPUs at once where the host has them, else one after the other);
# logs and JSON to $OUT (or ./gpu_out).  What it measures (docs/MODELS.md run G left these open):
#   lane A: first runs in fresh processes, each beside Inductor max-autotune in the same process
#           (M = 1 after the ptxas fix, 16, 64, 128 with the worker started in the background), then
#           Inductor fed by gemmtune: cold store, then a second program start with the store kept;
#   lane B: patched eager against plain eager with release=True among the variants, then the GPU
#           tests of the warm-up, the patched layer, the isolation faults and the compiled paths.
# Usage: bash bench/gpu_lanes7.sh
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
lane_a() {
  timeout 330 python bench/warmup_profile.py --cases 1+inductor,16+inductor,64+inductor,128+inductor \
    --out "$out/first_runs.json" > "$out/first_runs.log" 2>&1
  timeout 240 python bench/warmup_profile.py --cases 16+inductor+fed,16+fed+warm,128+inductor+fed,128+fed+warm \
    --out "$out/fed_first_runs.json" > "$out/fed_first_runs.log" 2>&1
}
lane_b() {
  timeout 260 python bench/model_rounds.py --m 1,16,64,128 --models stack \
    --variants eager,gemmtune,gemmtune_release,gemmtune_library --rounds 15 --out "$out/rounds_release.json" \
    > "$out/rounds_release.log" 2>&1
  timeout 300 python -m pytest -q -p no:cacheprovider tests/gpu/test_in_model_gpu.py tests/gpu/test_patch_fast_gpu.py \
    tests/gpu/test_faults_gpu.py tests/gpu/test_api_gpu.py tests/gpu/test_compiled_gpu.py > "$out/tests.log" 2>&1
}
. "$(dirname "$0")/two_lanes.sh"
run_lanes
grep -h "== case" "$out"/first_runs.log "$out"/fed_first_runs.log
grep -h "^|" "$out"/rounds_release.log
