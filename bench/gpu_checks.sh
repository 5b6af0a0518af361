#!/usr/bin/env bash
# One device call: the GPU tests split over the visible GPUs, then the dispatch probes and the
# six-shape comparison on GPU 0.  Logs and JSON go to $OUT (or ./gpu_out).
#   bash bench/gpu_checks.sh            # both halves on two GPUs when there are two
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
ngpu=$(nvidia-smi -L | wc -l)
first="tests/gpu/test_gpu.py tests/gpu/test_hopper_templates.py tests/gpu/test_skinny_gpu.py tests/gpu/test_compiled_gpu.py"
second="tests/gpu/test_api_gpu.py tests/gpu/test_faults_gpu.py tests/gpu/test_preview_templates.py"
probes() {
  python bench/compare.py --no-inductor --only square-2048,square-8192,odd-4097,llama3-8b-qkv-m1,llama3-8b-o-m16,llama3-8b-gate_up-m128 --out "$out/compare_after.json" > "$out/compare_after.log" 2>&1
  python bench/compiled_overhead.py --out "$out/compiled_overhead.json" > "$out/compiled_overhead.log" 2>&1
  python bench/eager_probe.py --m 64 --out "$out/eager_probe.json" > "$out/eager_probe.log" 2>&1
}
if [ "$ngpu" -ge 2 ]; then
  (CUDA_VISIBLE_DEVICES=0 python -m pytest -q -p no:cacheprovider $first > "$out/gpu_tests_a.log" 2>&1; CUDA_VISIBLE_DEVICES=0 probes) &
  CUDA_VISIBLE_DEVICES=1 python -m pytest -q -p no:cacheprovider $second > "$out/gpu_tests_b.log" 2>&1
  wait
else
  python -m pytest -q -p no:cacheprovider $first $second > "$out/gpu_tests_a.log" 2>&1
  probes
fi
tail -n 3 "$out"/gpu_tests_*.log; tail -n 12 "$out/compare_after.log" "$out/compiled_overhead.log" "$out/eager_probe.log"
