"""What a timing depends on besides the problem, per device kind (the store's `env_info`).

On CPU: the CPU model, the thread count, torch's BLAS, and the versions of torch, numba, NumPy
and NumPy's BLAS (the numba template and the NumPy library kernel run on them).  On a GPU: the
GPU model and compute capability, the driver, CUDA, torch and Triton.  gemmtune's own version is
in both.  A change in any of these makes the store key (`env_key`) differ, so stored timings are
measured again rather than trusted.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import platform
import re
from pathlib import Path
from typing import Any

import torch

from ..core.version import __version__


def device_env(device: str) -> dict[str, Any]:
    """The env_info of `device` ("cpu", "cuda", "cuda:1").

    Example:
        >>> info = device_env("cpu")
        >>> sorted(k for k in info if k in ("cpu_model", "numba", "numpy", "torch_blas", "triton"))
        ['cpu_model', 'numba', 'numpy', 'torch_blas']
    """
    if str(device).startswith("cuda"):
        return {**_gpu_env(str(device)), "gemmtune": __version__}
    return {**_cpu_env(), "threads": torch.get_num_threads(), "gemmtune": __version__}


def package_version(name: str) -> str | None:
    """The installed version of distribution `name`, or None.

    Example:
        >>> package_version("torch") is not None, package_version("no-such-package-here")
        (True, None)
    """
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def _cpu_env() -> dict[str, Any]:
    return {"torch": torch.__version__, "device": cpu_model(), "cpu_model": cpu_model(),
            "machine": platform.machine(), "capability": None, "cuda": None,
            "torch_blas": _torch_blas(), "numba": package_version("numba"), "numpy": package_version("numpy"),
            "numpy_blas": _numpy_blas()}


@functools.lru_cache(maxsize=None)
def _gpu_env(device: str) -> dict[str, Any]:
    dev = torch.device(device)
    return {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev),
            "capability": list(torch.cuda.get_device_capability(dev)), "cuda": torch.version.cuda,
            "driver": nvidia_driver(), "triton": package_version("triton")}


@functools.lru_cache(maxsize=None)  # read once per process (a slow /proc on some hosts)
def cpu_model() -> str:
    """The CPU's model name (`model name` in /proc/cpuinfo), else what `platform` knows.

    Example:
        >>> isinstance(cpu_model(), str) and len(cpu_model()) > 0
        True
    """
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def nvidia_driver() -> str | None:
    """The NVIDIA driver version (from /proc/driver/nvidia/version, else NVML), or None."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        words = text.split("Kernel Module", 1)[1].split() if "Kernel Module" in text else []
        if words:
            return words[0]
    except OSError:
        pass
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - no NVML: the driver stays unnamed
        return None


def _torch_blas() -> str | None:
    """torch's BLAS (BLAS_INFO of its build settings, e.g. "mkl")."""
    try:
        show = torch.__config__.show()
    except Exception:  # noqa: BLE001
        return None
    found = re.search(r"\bBLAS_INFO=([^,\s]+)", show)
    return found.group(1) if found else None


def _numpy_blas() -> str | None:
    """NumPy's BLAS as "name version" (e.g. "scipy-openblas 0.3.29")."""
    try:
        import numpy

        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return " ".join(str(blas[k]) for k in ("name", "version") if blas.get(k)) or None
    except Exception:  # noqa: BLE001 - an old NumPy without mode="dicts"
        return None
