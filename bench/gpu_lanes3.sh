#!/usr/bin/env bash
# One device call on the two-GPU host (logs and JSON to $OUT, or ./gpu_out):
#   lane A, GPU 0: Inductor max-autotune alone and fed by gemmtune (cold store, then warm) at
#                  M = 16, 128, 512, 4096 (bench/models.py, the 4-layer stack);
#   lane B, GPU 1: bench/compare.py on 4 suite shapes without and with the CuTe DSL template in the
#                  pool (GEMMTUNE_BACKENDS=extern,triton,cutlass; needs .whl/dsl carried).
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
SHAPES=square-4096,square-8192,odd-4097,llama3-8b-qkv-m4096
lane_a() {
  timeout 500 python bench/models.py --m 16,128,512,4096 --models stack --variants inductor,inductor_gemmtune \
    --out "$out/models_ind.json" > "$out/models_ind.log" 2>&1
}
lane_b() {
  [ -d .whl/dsl ] || return 0
  timeout 90 bash bench/cutlass_gpu.sh setup > "$out/cutlass_setup.log" 2>&1
  timeout 150 python bench/compare.py --no-inductor --only "$SHAPES" --rounds 20 --out "$out/cmp_without.json" \
    > "$out/cmp_without.log" 2>&1
  ( D="$PWD/.cutedsl"; export PYTHONPATH="$D/nvidia_cutlass_dsl/dsl_packages:$D:$PWD/src" CUTE_DSL_CACHE_DIR="$D/cache"
    GEMMTUNE_BACKENDS=extern,triton,cutlass timeout 300 python bench/compare.py --no-inductor --only "$SHAPES" \
      --rounds 20 --out "$out/cmp_with.json" ) > "$out/cmp_with.log" 2>&1
}
. "$(dirname "$0")/two_lanes.sh"
run_lanes 12
