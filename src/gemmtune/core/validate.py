"""Input validation: every bad input becomes an InputError naming the argument and the problem.

`validate_operands` is the one gate in front of `gemmtune.tune` (through
`KernelInputs.from_tensors`) and of the eager ops' first call of a problem.
Each check names the argument as torch does (`mat1`, `mat2`, `input`,
`batch1`, `batch2`, `alpha`, `beta`) and says what is wrong and, where there
is one, the fix.  docs/RELIABILITY.md lists every kind of bad input with its
message and its test (tests/test_validation.py).

Valid but unusual inputs are not errors: stride-0 (expanded) or overlapping
operands, non-contiguous slices, zero-size dimensions (the eager ops compute
them with torch; `tune` says there is nothing to tune), `requires_grad`
tensors, NaN and Inf values (data, not errors).

A problem whose tuning cannot fit in the device's free memory (the output,
its float64 reference and float64 copies of the operands) raises
`ProblemTooLargeError`, an `InputError` that is also a `MemoryError`, before
anything is allocated.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Sequence

import torch

from .errors import InputError

__all__ = ["ProblemTooLargeError", "validate_operands", "available_bytes", "tuning_bytes", "check_backends_arg"]

_ARG_NAMES = {"mm": ("mat1", "mat2"), "bmm": ("batch1", "batch2"), "addmm": ("input", "mat1", "mat2")}
_RANKS = {"mm": (2, 2), "bmm": (3, 3), "addmm": (None, 2, 2)}
_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SUPPORTED_TEXT = "float16, bfloat16, float32, float64"
# Below this working set the free-memory probe is skipped (it reads /proc; a tiny problem always fits).
_MEMORY_PROBE_BYTES = 256 << 20


class ProblemTooLargeError(InputError, MemoryError):
    """The problem cannot be tuned in the memory the device has free (raised before allocating)."""


def validate_operands(op: str, tensors: Sequence[Any], alpha: Any = 1.0, beta: Any = 1.0, *,
                      check_memory: bool = True) -> None:
    """Raise InputError unless `tensors` form a valid `op` problem gemmtune can tune.

    `check_memory=False` skips the free-memory check (describing a problem
    without running it).

    Example:
        >>> import torch
        >>> validate_operands("mm", [torch.ones(2, 3), torch.ones(3, 4)])
        >>> validate_operands("mm", [torch.ones(2, 3), torch.ones(4, 3)])
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: mm: inner dimensions differ: mat1 is (2, 3) and mat2 is (4, 3) (K 3 != 4)
    """
    if not isinstance(op, str) or op not in _ARG_NAMES:
        raise InputError(f"op: unknown op {op!r}; expected one of 'mm', 'addmm', 'bmm'")
    names = _ARG_NAMES[op]
    if len(tensors) != len(names):
        raise InputError(f"{op}: expected {len(names)} tensors ({', '.join(names)}), got {len(tensors)}")
    for name, t in zip(names, tensors):
        _check_tensor(op, name, t)
    _check_scalar(op, "alpha", alpha)
    _check_scalar(op, "beta", beta)
    if op != "addmm" and (float(alpha) != 1.0 or float(beta) != 1.0):
        raise InputError(f"{op}: alpha and beta belong to addmm only (got alpha={alpha!r}, beta={beta!r}); "
                         f"scale the result, or use addmm")
    _check_ranks(op, names, tensors)
    a, b = _check_matrices(op, names, tensors)
    if op == "addmm":
        _check_bias(tensors[0], a, b)
    if check_memory:
        _check_memory(op, tensors)


# -- the checks ----------------------------------------------------------------------------------

def _check_ranks(op: str, names: Sequence[str], tensors: Sequence[Any]) -> None:
    """Each operand has its op's rank and no negative stride."""
    for name, t, rank in zip(names, tensors, _RANKS[op]):
        if rank is not None and t.dim() != rank:
            hint = " (a 4-D activation must be reshaped to 2-D first)" if op == "mm" and t.dim() == 4 else ""
            raise InputError(f"{op}: {name} must be {rank}-D, got {t.dim()}-D with shape {tuple(t.shape)}{hint}")
        if any(s < 0 for s in t.stride()):
            raise InputError(f"{op}: {name} has a negative stride {tuple(t.stride())}; pass a copy (.contiguous())")


def _check_matrices(op: str, names: Sequence[str], tensors: Sequence[Any]) -> tuple[Any, Any]:
    """The two matrices (A, B) agree: one dtype, one real device, inner dimensions, batch; returns them."""
    mats = tensors[1:] if op == "addmm" else tensors
    mnames = names[1:] if op == "addmm" else names
    a, b = mats
    if a.dtype != b.dtype:
        raise InputError(f"{op}: {mnames[0]} is {a.dtype} but {mnames[1]} is {b.dtype}; cast them to one dtype")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise InputError(f"{op}: tensors are on different devices {sorted(map(str, devices))}; "
                         f"move them to one device")
    if a.device.type == "meta":
        raise InputError(f"{op}: {mnames[0]} is on the meta device (no data): gemmtune runs and times kernels, "
                         f"so the operands must be real tensors (cpu or cuda)")
    if a.shape[-1] != b.shape[-2]:
        raise InputError(f"{op}: inner dimensions differ: {mnames[0]} is {tuple(a.shape)} and "
                         f"{mnames[1]} is {tuple(b.shape)} (K {a.shape[-1]} != {b.shape[-2]})")
    if op == "bmm" and a.shape[0] != b.shape[0]:
        raise InputError(f"bmm: batch sizes differ: batch1 has {a.shape[0]}, batch2 has {b.shape[0]} "
                         f"(bmm does not broadcast the batch)")
    return a, b


def _check_tensor(op: str, name: str, t: Any) -> None:
    """One operand on its own: a dense, strided, real floating-point torch.Tensor."""
    if not isinstance(t, torch.Tensor):
        hint = ""
        if type(t).__module__ == "numpy":
            hint = "; convert it with torch.from_numpy"
        elif isinstance(t, (list, tuple, int, float)) and not isinstance(t, bool):
            hint = "; convert it with torch.tensor"
        raise InputError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}{hint}")
    if t.is_nested:
        raise InputError(f"{op}: {name} is a nested tensor; gemmtune needs dense tensors (pad it or unbind it)")
    if t.layout != torch.strided:
        raise InputError(f"{op}: {name} must be a dense strided tensor, got layout {t.layout} "
                         f"(call .to_dense() first)")
    if t.is_quantized:
        raise InputError(f"{op}: {name} is quantized ({t.dtype}); gemmtune supports {_SUPPORTED_TEXT} "
                         f"(call .dequantize() first)")
    if t.is_complex() or not t.is_floating_point():
        raise InputError(f"{op}: {name} has dtype {t.dtype}; gemmtune supports {_SUPPORTED_TEXT}")
    if t.dtype not in _SUPPORTED:
        raise InputError(f"{op}: {name} has unsupported dtype {t.dtype}; gemmtune supports {_SUPPORTED_TEXT}")
    if t.is_neg():
        # A lazy negation view (e.g. `x.conj().imag`): kernels reading raw memory would see the
        # un-negated values.  The eager ops resolve it themselves; tune() asks the caller to.
        raise InputError(f"{op}: {name} is a lazy negation view (negative bit set, e.g. x.conj().imag); "
                         f"call .resolve_neg() first")


def _check_scalar(op: str, name: str, value: Any) -> None:
    """alpha / beta: a finite real number (Python or NumPy scalar), not a bool, complex or tensor."""
    if isinstance(value, torch.Tensor):
        raise InputError(f"{op}: {name} must be a real number, got a tensor {tuple(value.shape)}; "
                         f"pass a Python float ({name}.item())")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = "complex" if isinstance(value, numbers.Complex) and not isinstance(value, bool) else type(value).__name__
        raise InputError(f"{op}: {name} must be a finite real number, got {kind} {value!r}")
    if not math.isfinite(float(value)):
        raise InputError(f"{op}: {name} must be a finite real number, got {value!r}")


def _check_bias(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    if bias.dtype != a.dtype:
        raise InputError(f"addmm: input (bias) is {bias.dtype} but mat1 is {a.dtype}; cast them to one dtype")
    out = (a.shape[0], b.shape[1])
    if bias.dim() > 2:
        raise InputError(f"addmm: input (bias) must be 0-, 1- or 2-D, got {bias.dim()}-D with shape "
                         f"{tuple(bias.shape)}")
    # Broadcasting to the output, spelled out: `torch.broadcast_shapes` imports torch's symbolic-shape
    # machinery (sympy) on its first call, half a second of a fresh process's first addmm.
    if not all(d in (1, o) for d, o in zip(reversed(bias.shape), reversed(out))):
        raise InputError(f"addmm: input (bias) of shape {tuple(bias.shape)} does not broadcast to the output {out}")


# -- memory ----------------------------------------------------------------------------------------

def tuning_bytes(op: str, tensors: Sequence[torch.Tensor]) -> int:
    """A lower bound on the memory tuning allocates: the output, its float64 reference, float64 operand copies.

    Counted by elements, not storage: the reference copies an expanded
    (stride-0) operand in full.

    Example:
        >>> import torch
        >>> tuning_bytes("mm", [torch.ones(2, 3), torch.ones(3, 4)])  # 8 outputs x (4 + 8) + 18 x 8
        240
    """
    a, b = tensors[-2], tensors[-1]
    batch = a.shape[0] if op == "bmm" else 1
    out_numel = batch * a.shape[-2] * b.shape[-1]
    operands = sum(t.numel() for t in tensors)
    return out_numel * (a.element_size() + 8) + 8 * operands


def available_bytes(device: torch.device) -> int | None:
    """Free memory on `device` in bytes, or None when unknown.

    CPU: `MemAvailable` from /proc/meminfo (else sysconf's available pages),
    capped by the cgroup's limit minus its usage.  CUDA: the driver's free
    memory plus what torch's caching allocator holds unused.
    """
    if device.type == "cpu":
        return _cpu_available()
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            free, _total = torch.cuda.mem_get_info(device)
            cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return int(free) + max(0, int(cached))
        except Exception:  # noqa: BLE001 - a driver that cannot say: do not guess
            return None
    return None


def _cpu_available() -> int | None:
    avail: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f:
                raw = f.read().strip()
            if raw == "max" or int(raw) >= 1 << 60:
                continue
            with open(usage_file) as f:
                usage = int(f.read().strip())
            avail = min(avail, max(0, int(raw) - usage))
            break
        except (OSError, ValueError):
            continue
    return avail


def _check_memory(op: str, tensors: Sequence[torch.Tensor]) -> None:
    need = tuning_bytes(op, tensors)
    if need < _MEMORY_PROBE_BYTES:
        return
    device = tensors[-1].device
    have = available_bytes(device)
    if have is not None and need > have:
        a, b = tensors[-2], tensors[-1]
        batch = a.shape[0] if op == "bmm" else 1
        out_bytes = batch * a.shape[-2] * b.shape[-1] * a.element_size()
        raise ProblemTooLargeError(
            f"{op}: too large to tune on {device}: the output alone is {_gib(out_bytes)}, and tuning needs at "
            f"least {_gib(need)} (output + float64 reference + float64 operand copies) but only {_gib(have)} "
            f"is free")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**27 else f"{n / 2**20:,.1f} MiB"


# -- other arguments of the eager ops ---------------------------------------------------------------

def check_backends_arg(backends: Any) -> None:
    """`backends` must be None, a comma-separated string or a tuple/list of family-name strings."""
    from .errors import BackendError

    if backends is None or isinstance(backends, str):
        return
    if not isinstance(backends, (tuple, list)) or not all(isinstance(b, str) for b in backends):
        raise BackendError(f"backends: expected None, a string or a tuple of family names "
                           f"('extern', 'triton', 'numba', 'cutlass'), got {type(backends).__name__} {backends!r}")


TUNE_OPTIONS = ("settings", "templates", "finalize", "listener", "store_tag", "progress", "store")
"""The options of `gemmtune.tune` that `check_tune_options` checks."""


def check_tune_options(settings: Any = None, templates: Any = None, finalize: Any = (), listener: Any = None,
                       store_tag: Any = None, progress: Any = None, store: Any = None) -> None:
    """InputError naming the first of `gemmtune.tune`'s options that is not of its kind (the operands and
    scalars are `validate_operands`' to check).

    Example:
        >>> check_tune_options(None, None, (), None, "traced", False)
        >>> check_tune_options("off", None, (), None, None, None)
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: settings: expected a gemmtune.Settings or None, got str
    """
    from .settings import Settings

    def bad_item(value: Any, ok: Any) -> str | None:
        """Why `value` is no tuple or list of items `ok` accepts (None: it is one)."""
        if not isinstance(value, (tuple, list)):
            return f"got {type(value).__name__}"
        return next((f"item {i} is {type(v).__name__}" for i, v in enumerate(value) if not ok(v)), None)

    def is_template(t: Any) -> bool:
        return isinstance(getattr(t, "uid", None), str) and callable(getattr(t, "configs", None))

    if settings is not None and not isinstance(settings, Settings):
        raise InputError(f"settings: expected a gemmtune.Settings or None, got {type(settings).__name__}")
    if templates is not None and (why := bad_item(templates, is_template)):
        raise InputError(f"templates: expected None or a tuple or list of templates (gemmtune.templates); {why}")
    if why := bad_item(finalize, callable):
        raise InputError(f"finalize: expected a tuple or list of callables; {why}")
    if listener is not None and not callable(listener):
        raise InputError(f"listener: expected a callable or None, got {type(listener).__name__}")
    if store_tag is not None and not isinstance(store_tag, str):
        raise InputError(f"store_tag: expected a string or None, got {type(store_tag).__name__}")
    check_flags("", True, progress=progress)
    if store is not None and not callable(getattr(store, "load", None)):
        raise InputError(f"store: expected an open store (gemmtune.store.locations.open_store) or None, got "
                         f"{type(store).__name__}; a path, a redis:// URL or 'off' goes in "
                         f"settings=gemmtune.Settings(store=...)")


def check_model_options(where: str, model: Any, backends: Any, **flags: Any) -> None:
    """InputError naming the first of `where`'s options that is not of its kind: `model` a `torch.nn.Module`,
    each of `flags` True, False or None; `backends` as `check_backends_arg` (a BackendError).

    Example:
        >>> check_model_options("patch", torch.nn.Linear(2, 2), ("extern",), report=False)
        >>> check_model_options("warmup", torch.nn.Linear(2, 2), None, release="yes")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: warmup: release: expected True, False or None, got 'yes'
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"{where}: model: expected a torch.nn.Module, got {type(model).__name__}")
    check_backends_arg(backends)
    check_flags(f"{where}: ", True, **flags)


def check_flags(prefix: str, optional: bool, **flags: Any) -> None:
    """InputError, its message led by `prefix`, for the first of `flags` that is not True or False (or
    None, where `optional`).

    Example:
        >>> check_flags("install: ", False, pipeline=True, all_threads=None)
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: install: all_threads: expected True or False, got None
    """
    for name, value in flags.items():
        if not (isinstance(value, bool) or (optional and value is None)):
            kinds = "True, False or None" if optional else "True or False"
            raise InputError(f"{prefix}{name}: expected {kinds}, got {value!r}")
