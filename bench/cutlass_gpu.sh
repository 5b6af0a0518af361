#!/usr/bin/env bash
# The CuTe DSL template (docs/CUTLASS.md): set up nvidia-cutlass-dsl 4.8.1 (cu13) on the GPU machine from the wheels carried in
# .whl/ (git-ignored; made on the CPU machine, see the commit that added this file) and run the
# cutlass_hopper checks.  The machine has no network.  The carry limit is 64 MiB, so the files come
# in two folders (each call may carry one; what is extracted into .cutedsl/ stays while the machine
# is warm):
#   .whl/dsl/   54 MiB: nvidia_cutlass_dsl{,_libs_base,_libs_core}-4.8.1 wheels + cu13.tar.xz
#               (the 92 MB nvidia-cutlass-dsl-libs-cu13 wheel, unzipped, tar | xz -9e)
#   .whl/deps/  8.2 MiB: cuda-bindings 13.5.0 (cp312), cuda-pathfinder, protobuf: the DSL's deps,
#               needed only if `python -c "import cuda.bindings.driver, google.protobuf"` fails there.
# Usage (run tool, repository root):
#   1. carry [".whl/dsl"]:  bash bench/cutlass_gpu.sh setup
#   2. if step 1 printed "MISSING DEPS": carry [".whl/deps"]:  bash bench/cutlass_gpu.sh deps
#   3. no carry:  bash bench/cutlass_gpu.sh compile   (JIT compile time per config, 3 configs x 4 variants)
#   4. no carry:  bash bench/cutlass_gpu.sh test      (numerics vs float64, all swizzles/rasters; speed print)
#   optional:     bash bench/cutlass_gpu.sh compile-all (all 84 configs x 4 variants; ~1 s each on a CPU)
# cuda-bindings 13 and the cu13 libs need a driver for CUDA 13 (>= 580): `nvidia-smi` shows it.
set -euo pipefail
D="$PWD/.cutedsl"
export PYTHONPATH="$D/nvidia_cutlass_dsl/dsl_packages:$D:$PWD/src"
export CUTE_DSL_CACHE_DIR="${CUTE_DSL_CACHE_DIR:-$D/cache}"
PY="${PYTHON:-python}"

case "${1:-}" in
  setup)
    nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
    rm -rf "$D" && mkdir -p "$D"
    for w in .whl/dsl/*.whl; do "$PY" -m zipfile -e "$w" "$D"; done
    xz -dc .whl/dsl/cu13.tar.xz | tar -xf - -C "$D"
    du -sh "$D"
    "$PY" -c "import cuda.bindings.driver, google.protobuf" 2>/dev/null || echo "MISSING DEPS: run step 2"
    "$PY" -c "import cutlass, cutlass.cute; print('cutlass', cutlass.__version__)" || true
    ;;
  deps)
    for w in .whl/deps/*.whl; do "$PY" -m zipfile -e "$w" "$D"; done
    "$PY" -c "import cutlass, cutlass.cute; print('cutlass', cutlass.__version__)"
    ;;
  compile)
    "$PY" bench/cutlass_compile.py
    ;;
  compile-all)
    "$PY" bench/cutlass_compile.py all
    ;;
  test)
    "$PY" -c "from gemmtune.templates.cutlass.hopper import unavailable_reason as r; print('reason:', r())"
    "$PY" -m pytest -q -s -x tests/gpu/test_cutlass_gpu.py
    ;;
  *)
    echo "usage: bash bench/cutlass_gpu.sh setup|deps|compile|compile-all|test" >&2; exit 2
    ;;
esac
