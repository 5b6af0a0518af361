"""Zero-padded storage kept from call to call, for the padded candidates' operands.

A padded candidate (`templates.padded`) copies each operand into aligned storage whose padding is zero.
`torch.constant_pad_nd` does that by allocating the storage, filling all of it with zeros and copying
the operand in, on every call: on a GPU two kernel launches and their dispatches of host time, and a
write of the whole padded matrix besides the copy.  `staged_padder` keeps the storage, its zeros written
once, and copies only the operand into its top-left block: one launch per call.

Kept storage is never shared by calls that could overlap: it is keyed by the thread, the device and
the device's current CUDA stream (calls on one stream run in its order, so the next call's copy waits
for the kernel that read the last one), by the operand's place in the call (A and B of one call never
share), and by its shape and dtype besides the padded shape, so the zeros are never overwritten by a
larger block.  An operand is padded as before (`fallback`) where keeping its storage would be unsafe: a
tensor subclass (a parameter, whose padded copy the caller keeps; fake and functional tensors under
tracing), a tensor under `torch.vmap` or another functorch transform, an operand that needs gradients
(the padded launcher pads every operand of a call autograd records anew: autograd may save any of
them), a device other than the CPU or a CUDA GPU, or a CUDA stream being captured into a graph.  Its
memory comes from the caching allocator's general pool, never a CUDA graph's private one
(`made_outside_pools`).  At most `MAX_BYTES` are kept, the oldest dropped first; `forget` frees them
all (each tune's runner does when it closes, and `gemmtune.clear_dispatch_cache`).

Example:
    >>> import torch
    >>> pad = staged_padder(True, 2, 4, fallback=lambda t: None)
    >>> first = pad(torch.ones(2, 3))
    >>> first.tolist(), pad(torch.full((2, 3), 2.0)).data_ptr() == first.data_ptr()
    ([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]], True)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

import torch

MAX_BYTES = 128 << 20
"""The most bytes of padded storage kept, over every thread, device and stream; a matrix larger than
this is padded on every call."""

_LOCK = threading.Lock()
_KEPT: "OrderedDict[tuple, Any]" = OrderedDict()  # key -> (padded storage, the view its operand is copied into)
_KEPT_BYTES = [0]

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Inductor's generated code calls


def _stream(device: int) -> int:
    """The current CUDA stream of `device` (an index; -1, the CPU: 0)."""
    if device < 0:
        return 0
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream  # pragma: no cover - torch without the raw call


_functorch_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


def stageable(t: torch.Tensor) -> bool:
    """Whether `t`'s padded storage may be kept (the module docstring lists what may not).

    Example:
        >>> stageable(torch.ones(2)), stageable(torch.nn.Parameter(torch.ones(2)))
        (True, False)
    """
    if type(t) is not torch.Tensor or (t.requires_grad and torch.is_grad_enabled()) or _functorch_wrapped(t):
        return False
    if t.is_cuda:
        return not torch.cuda.is_current_stream_capturing()
    return t.device.type == "cpu"


_SIDE: dict[int, Any] = {}  # CUDA device index -> a stream of gemmtune's own there


def made_outside_pools(make: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
    """`make()`, a tensor to keep from call to call, with its memory from the caching allocator's general
    pool: on a CUDA device `make` runs on a stream of gemmtune's own, whose allocations no CUDA graph
    routes to its private pool (torch.compile's CUDA graphs route their warm-up runs' allocations there,
    on their own stream, and may write over memory they do not track).  The current stream waits for it,
    and when it is freed its memory waits for the current stream's work.

    Example:
        >>> made_outside_pools(lambda: torch.zeros(2), torch.device("cpu")).tolist()
        [0.0, 0.0]
    """
    if device.type != "cuda":
        return make()
    current = torch.cuda.current_stream(device)
    side = _SIDE.get(device.index) or _SIDE.setdefault(device.index, torch.cuda.Stream(device))
    side.wait_stream(current)  # what `make` reads was written on the current stream
    with torch.cuda.stream(side):
        made = make()
    current.wait_stream(side)
    made.record_stream(current)
    return made


def _storage(t: torch.Tensor, rows: int, cols: int, row_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """New zeroed storage for `t` padded to (rows, cols) in its orientation (`made_outside_pools`), and
    its top-left view."""
    lead = tuple(t.shape[:-2])
    byte = t.dtype.itemsize == 1 and t.dtype.is_floating_point  # fp8: zero its bytes (0x00 is +0.0)
    dims = lead + ((rows, cols) if row_major else (cols, rows))

    def zeros() -> torch.Tensor:
        with torch.inference_mode(False):  # kept across calls inside and outside inference mode
            return torch.zeros(dims, dtype=torch.uint8 if byte else t.dtype, device=t.device)

    padded = made_outside_pools(zeros, t.device)
    padded = padded.view(t.dtype) if byte else padded
    padded = padded if row_major else padded.mT
    return padded, padded[..., : t.shape[-2], : t.shape[-1]]


def _kept(key: tuple, t: torch.Tensor, rows: int, cols: int, row_major: bool) -> Any:
    """The storage kept under `key`, made (and older storage dropped past `MAX_BYTES`) on a miss;
    None where `t`'s padded storage alone exceeds `MAX_BYTES`."""
    entry = _KEPT.get(key)
    if entry is not None:
        return entry
    size = t.dtype.itemsize * rows * cols
    for n in t.shape[:-2]:
        size *= n
    if size > MAX_BYTES:
        return None
    entry = _storage(t, rows, cols, row_major)
    with _LOCK:
        while _KEPT and _KEPT_BYTES[0] + size > MAX_BYTES:
            _, (old, _view) = _KEPT.popitem(last=False)
            _KEPT_BYTES[0] -= old.numel() * old.element_size()
        _KEPT[key] = entry
        _KEPT_BYTES[0] += size
    return entry


def staged_padder(row_major: bool, rows: int, cols: int, fallback: Callable[[Any], Any],
                  slot: str = "") -> Callable[[Any], Any]:
    """`pad(t)`: a matrix (its last two dimensions; row-major or column-major) copied into kept
    zero-padded storage of (rows, cols) in that orientation, and that storage returned; `fallback(t)`
    where `stageable(t)` is False or the storage would exceed `MAX_BYTES`.  The storage is the caller's
    until the next call of a padder of the same `slot` (one per operand of a call: "a", "b") on the same
    thread and stream.

    Example:
        >>> pad = staged_padder(True, 1, 4, fallback=lambda t: "padded anew")
        >>> pad(torch.ones(1, 2)).tolist(), pad(torch.ones(1, 2, requires_grad=True))
        ([[1.0, 1.0, 0.0, 0.0]], 'padded anew')
    """
    shape_key = (slot, rows, cols, row_major)

    def pad(t: Any) -> Any:
        if not stageable(t):
            return fallback(t)
        device = t.get_device()  # -1: the CPU
        key = (threading.get_ident(), device, _stream(device), t.dtype, tuple(t.shape), shape_key)
        entry = _kept(key, t, rows, cols, row_major)
        if entry is None:
            return fallback(t)
        entry[1].copy_(t)
        return entry[0]

    return pad


def kept_bytes() -> int:
    """Bytes of padded storage kept now (at most `MAX_BYTES`).

    Example:
        >>> 0 <= kept_bytes() <= MAX_BYTES
        True
    """
    return _KEPT_BYTES[0]


def forget() -> None:
    """Drop every kept storage (tests; a caller that wants its memory back).

    Example:
        >>> forget(); kept_bytes()
        0
    """
    with _LOCK:
        _KEPT.clear()
        _KEPT_BYTES[0] = 0
