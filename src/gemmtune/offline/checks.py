"""Checks of the command line's device and problems, run before anything is allocated."""

from __future__ import annotations

import torch

from ..core.errors import InputError
from ..core.inputs import parse_dtype
from ..core.validate import ProblemTooLargeError, available_bytes, tuning_bytes
from .cli_args import check_device_spelling
from .suite import ProblemSpec


def default_device() -> str:
    """cuda where a CUDA GPU is visible, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(text: str | None) -> str:
    """The device to tune on, checked: cpu, or cuda / cuda:N where CUDA is available.  Raises InputError.

    Example:
        >>> check_device("cpu")
        'cpu'
        >>> check_device("tpu")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: argument --device: unknown device 'tpu'; expected cpu or cuda (cuda:N)
    """
    if text is None:
        return default_device()
    check_device_spelling(text)  # cpu, cuda or cuda:N
    dev = torch.device(text)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible")
            raise InputError(f"argument --device: {text!r} is not available ({why}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"argument --device: {text!r} does not exist ({torch.cuda.device_count()} CUDA devices)")
    return str(dev)


def check_fits(spec: ProblemSpec, device: str, arg: str) -> None:
    """Raise ProblemTooLargeError, before allocating, when tuning `spec` cannot fit in `device`'s free memory.

    Example:
        >>> check_fits(ProblemSpec(64, 64, 64), "cpu", "--shape")
    """
    dtype = parse_dtype(spec.dtype)
    lead = (spec.batch,) if spec.op == "bmm" else ()
    ops = [torch.empty(*lead, spec.M, spec.K, dtype=dtype, device="meta"),
           torch.empty(*lead, spec.K, spec.N, dtype=dtype, device="meta")]
    if spec.op == "addmm":
        ops.insert(0, torch.empty(spec.N, dtype=dtype, device="meta"))
    need = tuning_bytes(spec.op, ops)
    places = [(torch.device(device), need)]
    if places[0][0].type != "cpu":  # the operands are made on the host first, in float32
        places.append((torch.device("cpu"), 4 * max(t.numel() for t in ops)))
    for dev, bytes_needed in places:
        have = available_bytes(dev)
        if have is not None and bytes_needed > have:
            name = f" ({spec.name})" if spec.name else ""
            raise ProblemTooLargeError(
                f"{arg}{name}: {spec.describe()} is too large to tune on {dev.type}: it needs at least "
                f"{bytes_needed / 2**30:,.1f} GiB (output, its float64 reference and float64 operand copies) "
                f"but {have / 2**30:,.1f} GiB is free")
