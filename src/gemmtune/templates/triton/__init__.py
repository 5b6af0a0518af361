"""Triton templates (NVIDIA GPUs; the Triton interpreter on CPU for tests).

`base` holds what the templates share (`TritonTemplate`, support checks, source hash, warm-up and
launch, kernel arguments, resource limits); `launch` the direct launch path (`FastLaunch`).  One
module per template: `mm`, `splitk`, `skinny`, `gemv`, `tma`, each beside its `@triton.jit`
source (`*_kernel.py`), which builds on the device functions of `common_kernel.py`.
"""
