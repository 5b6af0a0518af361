"""Triton templates (NVIDIA GPUs; the Triton interpreter on CPU for tests)."""
