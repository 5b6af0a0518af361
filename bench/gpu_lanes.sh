#!/usr/bin/env bash
# One device call on the two-GPU host, two lanes at once (logs and JSON to $OUT, or ./gpu_out):
#   lane A, GPU 0: the bound-launch and patch GPU tests, bench/dispatch_overhead.py on model-sized
#                  problems, bench/model_rounds.py (eager, patched, patched with library picks only);
#   lane B, GPU 1: the CuTe DSL template (bench/cutlass_gpu.sh setup, compile, test; needs .whl/dsl
#                  carried), then the other GPU tests.
# Usage: bash bench/gpu_lanes.sh [M list for model_rounds, default 64,1,128]
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
ms=${1:-64,1,128}
lane_a() {
  timeout 150 python -m pytest -q -s -p no:cacheprovider tests/gpu/test_bound_launch_gpu.py tests/gpu/test_patch_fast_gpu.py > "$out/a_tests.log" 2>&1
  timeout 150 python bench/dispatch_overhead.py --shapes 1x4096x6144,16x4096x4096,64x4096x6144,64x14336x4096,128x4096x4096 \
    --out "$out/dispatch.json" > "$out/dispatch.log" 2>&1
  timeout 270 python bench/model_rounds.py --m "$ms" --models stack --variants eager,gemmtune,gemmtune_library --rounds 15 \
    --out "$out/rounds.json" > "$out/rounds.log" 2>&1
}
lane_b() {
  if [ -d .whl/dsl ]; then
    { timeout 90 bash bench/cutlass_gpu.sh setup && timeout 120 bash bench/cutlass_gpu.sh compile \
      && timeout 150 bash bench/cutlass_gpu.sh test; } > "$out/cutlass.log" 2>&1
  fi
  timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_skinny_gpu.py \
    tests/gpu/test_compiled_gpu.py tests/gpu/test_inductor_gpu.py > "$out/b_tests.log" 2>&1
}
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  CUDA_VISIBLE_DEVICES=0 lane_a & CUDA_VISIBLE_DEVICES=1 lane_b; wait
else
  lane_a; lane_b
fi
tail -n 4 "$out"/*.log
