# Sourced by the bench/gpu_lanes*.sh scripts: run lane_a on GPU 0 and lane_b on GPU 1 at once where
# the host has two GPUs, else one after the other; then print the end (last $1 lines, default 4) of
# every log under $out.
run_lanes() {
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    CUDA_VISIBLE_DEVICES=0 lane_a & CUDA_VISIBLE_DEVICES=1 lane_b; wait
  else
    lane_a; lane_b
  fi
  tail -n "${1:-4}" "$out"/*.log
}
