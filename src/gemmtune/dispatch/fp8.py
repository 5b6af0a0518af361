"""`gemmtune.scaled_mm` (the tuned `torch._scaled_mm`) and the routing of a model's `torch._scaled_mm` calls.

The eager op keeps its runners in the dispatch table (`TABLE.runners["scaled_mm"]`) under a plain tuple
of every operand's shape, strides, dtype and device, `out_dtype`, `use_fast_accum` and `backends`: the
warm path is one dict look-up, as for `gemmtune.mm`.  A miss validates (torch's rules, typed errors:
`core/validate_fp8.py`), tunes under the table's lock and keeps the winner; a library winner is
`torch._scaled_mm` itself.

A model does not call `gemmtune.scaled_mm`: its fp8 linear layers (torchao's, a vLLM-style module)
call `torch._scaled_mm` in their forward.  `ScaledMMRouter` is a `torch.overrides.TorchFunctionMode`
that hands every `torch._scaled_mm` call made inside it to `gemmtune.scaled_mm` (a call gemmtune does
not tune, e.g. a float8 output or `scale_result`, runs torch's op unchanged).  `route(model)` runs
the model's forward under it (`gemmtune.patch(model, scaled_mm=True)`; `gemmtune.warmup` records
under it and routes a model whose forward met `torch._scaled_mm`).  docs/FP8.md.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..core.binding import first_call_binding
from ..core.errors import InputError, NoCandidatesError
from .table import TABLE

__all__ = ["scaled_mm", "ScaledMMRouter", "route", "unroute", "is_routed", "prepare", "scaled_key"]

_OP = "scaled_mm"
_RUNNERS = TABLE.runners[_OP]
_HITS = TABLE.hits
_is_compiling = torch.compiler.is_compiling
_torch_scaled_mm = torch._scaled_mm
_ROUTED = "_gemmtune_scaled_mm_forward"  # instance attribute of a routed module: its own forward
_BACKENDS = "_gemmtune_scaled_mm_backends"  # and the backends its calls are tuned with


def scaled_key(tensors: Sequence[torch.Tensor], out_dtype: Any, fast: Any, backends: Any) -> tuple:
    """The key a scaled_mm problem's runner is kept under: every operand's shape, strides, dtype and
    device, then `out_dtype`, `use_fast_accum` (with its type: 1 is not True), `backends` and the
    output layout (always None: row-major), the last two as in every dispatch key.

    Example:
        >>> k = scaled_key((torch.ones(2, 3), torch.ones(3, 4)), torch.bfloat16, False, ("extern",))
        >>> k[0], k[-5:]
        (torch.Size([2, 3]), (torch.bfloat16, False, <class 'bool'>, ('extern',), None))
    """
    return (*(x for t in tensors for x in (t.shape, t.stride(), t.dtype, t.device)),
            out_dtype, fast, fast.__class__, backends, None)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
              use_fast_accum: bool = False, *, backends: Sequence[str] | str | None = None) -> torch.Tensor:
    """`torch._scaled_mm(a, b, scale_a, scale_b, bias, out_dtype=..., use_fast_accum=...)`, run by the
    tuned winner: `(a * scale_a) @ (b * scale_b) (+ bias)` in `out_dtype`.

    `a` [M, K] row-major and `b` [K, N] column-major float8 (e4m3fn or e5m2), float32 scales,
    tensor-wise (one element each) or row-wise (`scale_a` [M, 1], `scale_b` [1, N]); the rules are
    torch's on CUDA, applied on every device, each broken one an InputError (docs/FP8.md).  The first
    call of a problem tunes it; later calls dispatch straight to the winner.

    Example:
        >>> import torch, gemmtune
        >>> a = torch.randn(16, 32).to(torch.float8_e4m3fn)
        >>> w = torch.randn(48, 32).to(torch.float8_e4m3fn)
        >>> one = torch.tensor(1.0)
        >>> out = gemmtune.scaled_mm(a, w.t(), one, one)
        >>> out.dtype, torch.equal(out, torch._scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16))
        (torch.bfloat16, True)
    """
    tensors = (a, b, scale_a, scale_b) if bias is None else (a, b, scale_a, scale_b, bias)
    if _is_compiling():  # traced: torch's op (Inductor's own `_scaled_mm` lowering builds it)
        return _torch_scaled_mm(*tensors[:4], bias=bias, out_dtype=out_dtype, use_fast_accum=use_fast_accum)
    try:
        fn = _RUNNERS[scaled_key(tensors, out_dtype, use_fast_accum, backends)]
    except Exception:  # noqa: BLE001 - a miss; or not tensors, unhashable backends: the miss path says why
        fn = _miss(tensors, out_dtype, use_fast_accum, backends)
    else:
        next(_HITS)
    return fn(*tensors)


def _miss(tensors: tuple, out_dtype: Any, fast: Any, backends: Any) -> Callable[..., torch.Tensor]:
    """Validate, then find or build the runner of a problem not in the dict (tuned at most once)."""
    from ..core.settings import check_backends
    from ..core.validate import check_backends_arg
    from ..core.validate_fp8 import validate_scaled_mm

    with TABLE.lock:
        validate_scaled_mm(tensors, out_dtype, fast)
        check_backends_arg(backends)
        canon_backends = check_backends(backends)
        key: tuple | None = scaled_key(tensors, out_dtype, fast, backends)
        try:
            hash(key)
        except TypeError:  # backends as a list: kept under its canonical key only
            key = None
        canon = scaled_key(tensors, out_dtype, fast, canon_backends)
        if TABLE.recorder is not None:  # a warm-up's recording forward: torch computes it, the problem is kept
            TABLE.record(canon, _OP, tensors, 1.0, 1.0, canon_backends, None,
                         options=(("out_dtype", out_dtype), ("fast_accum", fast)))
            return _library(out_dtype, fast)
        fn = TABLE.runner(_OP, canon)
        if fn is None:
            fn = _build(tensors, out_dtype, fast, canon_backends, canon)
        TABLE.put(_OP, fn, canon, key)
        TABLE.count_miss()
        return fn


def _build(tensors: tuple, out_dtype: torch.dtype, fast: bool, backends: tuple[str, ...] | None,
           canon: tuple) -> Callable[..., torch.Tensor]:
    from .. import engine

    if tensors[0].numel() == 0 or tensors[1].numel() == 0:  # nothing to tune: torch computes it
        return _library(out_dtype, fast)
    with torch.no_grad():
        sel = engine.tune(_OP, *tensors, backends=backends, out_dtype=out_dtype, use_fast_accum=fast)
    TABLE.count_tune()
    if sel.kernel is None:
        raise NoCandidatesError(f"{sel.problem.describe()}: the selection has no kernel to run")
    TABLE.add_selection(canon, sel)
    if sel.winner.template_uid == "aten_scaled_mm":
        if len(tensors) > 4 and not tensors[4].is_contiguous():  # torch's op misreads a strided bias
            return sel.kernel
        return _library(out_dtype, fast)
    return first_call_binding(sel.kernel)  # bound to the problem on its first call, as the tuner timed it


def _library(out_dtype: torch.dtype, fast: bool) -> Callable[..., torch.Tensor]:
    """torch's op with the problem's options bound: (a, b, scale_a, scale_b[, bias]) -> out."""
    return functools.partial(_torch_scaled_mm, out_dtype=out_dtype, use_fast_accum=fast)


def prepare(tensors: tuple, options: dict[str, Any], backends: tuple[str, ...] | None) -> Any:
    """Tune one recorded scaled_mm problem (or read it from the store) into the dispatch dict; its
    Selection (None when the problem is empty).

    Example:
        >>> a, w = torch.ones(16, 32).to(torch.float8_e4m3fn), torch.ones(16, 32).to(torch.float8_e4m3fn)
        >>> one = torch.tensor(1.0)
        >>> prepare((a, w.t(), one, one), {"out_dtype": torch.bfloat16, "fast_accum": False}, None).winner.name
        'aten_scaled_mm'
    """
    out_dtype, fast = options["out_dtype"], options["fast_accum"]
    _miss(tensors, out_dtype, fast, backends)
    from ..core.settings import check_backends

    return TABLE.selection(scaled_key(tensors, out_dtype, fast, check_backends(backends)))


class ScaledMMRouter(TorchFunctionMode):
    """Within the block, `torch._scaled_mm` calls run through `gemmtune.scaled_mm` (with `backends`);
    a call gemmtune does not tune (a float8 output, `scale_result`, inputs its rules refuse) runs
    torch's op, which says what is wrong where something is.

    Example:
        >>> a, w = torch.ones(16, 32).to(torch.float8_e4m3fn), torch.ones(16, 32).to(torch.float8_e4m3fn)
        >>> one = torch.tensor(1.0)
        >>> with ScaledMMRouter():
        ...     out = torch._scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16)
        >>> out[0, 0].item()
        32.0
    """

    def __init__(self, backends: Sequence[str] | str | None = None):
        super().__init__()
        self.backends = backends

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _torch_scaled_mm:
            call = _as_call(args, kwargs)
            if call is not None:
                try:
                    return scaled_mm(*call, backends=self.backends)
                except InputError:
                    pass  # not a problem gemmtune tunes: torch's op runs it (and raises its own error)
        return func(*args, **kwargs)


_NAMES = ("a", "b", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")


def _as_call(args: tuple, kwargs: dict) -> tuple | None:
    """`torch._scaled_mm`'s arguments as gemmtune.scaled_mm's positional ones; None where gemmtune
    does not take the call (scale_result, a float8 output: `out_dtype` None is the input's dtype)."""
    if len(args) > len(_NAMES):
        return None
    named = dict(zip(_NAMES, args))
    aliases = {"self": "a", "mat2": "b"}
    for k, v in kwargs.items():
        named[aliases.get(k, k)] = v
    if named.get("scale_result") is not None or named.get("out_dtype") is None or len(named) < 4:
        return None
    try:
        return (named["a"], named["b"], named["scale_a"], named["scale_b"], named.get("bias"),
                named["out_dtype"], named.get("use_fast_accum", False))
    except KeyError:
        return None


def route(module: nn.Module, backends: Sequence[str] | str | None = None) -> nn.Module:
    """Run `module`'s forward under a `ScaledMMRouter`: its `torch._scaled_mm` calls are tuned.  Routing
    a routed module again changes its `backends`; `unroute` undoes it.  The routed forward is a method
    bound to the module, so a `copy.deepcopy` of it runs its own forward.

    Example:
        >>> m = route(torch.nn.Identity())
        >>> is_routed(m), is_routed(unroute(m))
        (True, False)
    """
    if _ROUTED not in module.__dict__:
        module.__dict__[_ROUTED] = module.forward
    module.__dict__[_BACKENDS] = tuple(backends) if isinstance(backends, list) else backends
    module.forward = types.MethodType(_routed_forward, module)  # type: ignore[method-assign]
    return module


def _routed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    with ScaledMMRouter(self.__dict__[_BACKENDS]):
        return self.__dict__[_ROUTED](*args, **kwargs)


def unroute(module: nn.Module) -> nn.Module:
    """Give a routed module its own forward back (a module never routed is returned unchanged)."""
    if _ROUTED in module.__dict__:
        original = module.__dict__.pop(_ROUTED)
        module.__dict__.pop(_BACKENDS, None)
        module.__dict__.pop("forward", None)
        if getattr(original, "__func__", None) is not type(module).forward:  # a forward set on the instance
            module.__dict__["forward"] = original
    return module


def is_routed(module: nn.Module) -> bool:
    """Whether `module`'s forward runs under a `ScaledMMRouter` (`route`)."""
    return _ROUTED in module.__dict__
