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
(`zeros_outside_pools`).  At most `MAX_BYTES` are kept, the least recently used dropped first;
`forget` frees them all (`gemmtune.clear_dispatch_cache` does; a tune's runner, when it closes, frees
its own thread's).

Example:
    >>> import torch
    >>> pad = staged_padder(True, 2, 4, fallback=lambda t: None)
    >>> first = pad(torch.ones(2, 3))
    >>> first.tolist(), pad(torch.full((2, 3), 2.0)).data_ptr() == first.data_ptr()
    ([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]], True)
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

MAX_BYTES = 128 << 20
"""The most bytes of padded storage kept, over every thread, device and stream; a matrix larger than
this is padded on every call."""

_LOCK = threading.Lock()
_KEPT: "OrderedDict[tuple, Any]" = OrderedDict()  # key -> (padded storage, the view its operand is copied into)
_KEPT_BYTES = [0]

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Inductor's generated code calls


def current_stream_handle(device: int) -> int:
    """The handle of `device`'s current CUDA stream (an index; -1, the CPU: 0), without a Stream object;
    kept storage and per-stream scratch buffers (`triton.skinny`) are keyed by it.

    Example:
        >>> current_stream_handle(-1)
        0
    """
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
_HELPER: list[Any] = []  # the one thread that allocates kept storage on a GPU (made on first use)


def _after_fork() -> None:
    """A forked child has none of its parent's threads: no helper, a free lock, streams of its own."""
    global _LOCK
    _LOCK = threading.Lock()
    _HELPER.clear()
    _SIDE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def zeros_outside_pools(dims: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor to keep from call to call, its memory from the caching allocator's general pool.
    On a CUDA device it is allocated and zeroed by a thread of gemmtune's own, on a stream of its own: a
    CUDA graph routes the allocations of the thread that warms it up or captures it to its private pool
    (torch.compile's CUDA graphs, `torch.cuda.use_mem_pool`), and may write over memory there that it
    does not track.  The current stream waits for the zeros, and when the tensor is freed its memory
    waits for the current stream's work.

    Example:
        >>> zeros_outside_pools((2,), torch.float32, torch.device("cpu")).tolist()
        [0.0, 0.0]
    """
    def zeros() -> torch.Tensor:
        with torch.inference_mode(False):  # kept across calls inside and outside inference mode
            return torch.zeros(dims, dtype=dtype, device=device)

    if device.type != "cuda":
        return zeros()

    def on_helper() -> tuple[torch.Tensor, Any]:
        side = _SIDE.get(device.index) or _SIDE.setdefault(device.index, torch.cuda.Stream(device))
        with torch.cuda.device(device), torch.cuda.stream(side):
            made, done = zeros(), torch.cuda.Event()
            done.record(torch.cuda.current_stream(device))  # the stream the zeros were written on
        return made, done

    with _LOCK:
        if not _HELPER:
            _HELPER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="gemmtune-staging"))
    made, done = _HELPER[0].submit(on_helper).result()
    current = torch.cuda.current_stream(device)
    current.wait_event(done)
    made.record_stream(current)
    return made


def _storage(t: torch.Tensor, rows: int, cols: int, row_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """New zeroed storage for `t` padded to (rows, cols) in its orientation (`zeros_outside_pools`), and
    its top-left view."""
    byte = t.dtype.itemsize == 1 and t.dtype.is_floating_point  # fp8: zero its bytes (0x00 is +0.0)
    dims = tuple(t.shape[:-2]) + ((rows, cols) if row_major else (cols, rows))
    padded = zeros_outside_pools(dims, torch.uint8 if byte else t.dtype, t.device)
    padded = padded.view(t.dtype) if byte else padded
    padded = padded if row_major else padded.mT
    return padded, padded[..., : t.shape[-2], : t.shape[-1]]


def padded_copy(t: torch.Tensor, rows: int, cols: int, row_major: bool) -> torch.Tensor:
    """A new zero-padded copy of `t` to (rows, cols) in its orientation, for the caller to keep (a
    parameter's, `templates.padded`): made as kept storage is (`zeros_outside_pools`), recording no
    autograd graph.

    Example:
        >>> padded_copy(torch.ones(1, 2, requires_grad=True), 1, 4, True).tolist()
        [[1.0, 1.0, 0.0, 0.0]]
    """
    padded, view = _storage(t, rows, cols, row_major)
    with torch.no_grad():
        view.copy_(t)
    return padded


def _kept(key: tuple, t: torch.Tensor, rows: int, cols: int, row_major: bool) -> Any:
    """The storage kept under `key`, made on a miss (the least recently used dropped past `MAX_BYTES`);
    None where `t`'s padded storage alone exceeds `MAX_BYTES`."""
    entry = _KEPT.get(key)
    if entry is not None:
        try:
            _KEPT.move_to_end(key)  # the least recently used goes first
        except KeyError:  # another thread dropped it just now: this call still holds it
            pass
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
        key = (threading.get_ident(), device, current_stream_handle(device), t.dtype, tuple(t.shape), shape_key)
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


def forget(thread: int | None = None) -> None:
    """Drop the storage kept for calls of `thread` (a `threading.get_ident()`; None: every thread's).

    Example:
        >>> forget(); kept_bytes()
        0
    """
    with _LOCK:
        for key in [k for k in _KEPT if thread is None or k[0] == thread]:
            old = _KEPT.pop(key)[0]
            _KEPT_BYTES[0] -= old.numel() * old.element_size()
