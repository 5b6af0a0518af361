#!/usr/bin/env bash
# One device call on the two-GPU host, two lanes at once (logs and JSON to $OUT, or ./gpu_out):
#   lane A, GPU 0: patched eager against plain eager (bench/model_rounds.py), where its host time goes
#                  (bench/patch_overhead.py), then Inductor fed by gemmtune against plain max-autotune;
#   lane B, GPU 1: the GPU tests of the patch, the in-model check, bound launches, Inductor and compiled
#                  programs; then the transformers Llama model, eager against patched eager.
# Usage: bash bench/gpu_lanes6.sh
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
lane_a() {
  timeout 230 python bench/model_rounds.py --m 64,16,1,128 --models stack \
    --variants eager,gemmtune,gemmtune_library --rounds 15 --out "$out/rounds_eager.json" > "$out/rounds_eager.log" 2>&1
  timeout 80 python bench/patch_overhead.py --m 64 --out "$out/patch_overhead.json" > "$out/patch_overhead.log" 2>&1
  timeout 240 python bench/model_rounds.py --m 16,128 --models stack \
    --variants inductor,inductor_gemmtune,inductor_gemmtune_alone --rounds 15 --out "$out/rounds_inductor.json" \
    > "$out/rounds_inductor.log" 2>&1
}
lane_b() {
  timeout 330 python -m pytest -q -s -p no:cacheprovider tests/gpu/test_in_model_gpu.py tests/gpu/test_patch_fast_gpu.py \
    tests/gpu/test_bound_launch_gpu.py tests/gpu/test_inductor_gpu.py tests/gpu/test_compiled_gpu.py > "$out/tests.log" 2>&1
  timeout 200 python bench/model_rounds.py --m 64,1 --models llama \
    --variants eager,gemmtune,gemmtune_library --rounds 15 --out "$out/rounds_llama.json" > "$out/rounds_llama.log" 2>&1
}
. "$(dirname "$0")/two_lanes.sh"
run_lanes
