"""Opt-in: route the matmuls of a module's `nn.Linear` layers through gemmtune.

`patch(model)` gives every `nn.Linear` in `model` (the model itself included) a forward that computes
`x @ W^T (+ b)` with `gemmtune.addmm` (with a bias) or `gemmtune.mm` (without).  Inputs of any rank are
flattened to 2-D and the output reshaped back, as `nn.Linear` does.  `unpatch(model)` restores them.
Outputs, gradients and `torch.compile` keep working; each new input shape is tuned once on its first call.

Once an input size is decided for the library kernel, a call checks the input's element count and
calls `F.linear` (the call an unpatched layer makes) on the weight and bias from the parameter dict,
which skips the two `Module.__getattr__` calls of the unpatched forward; a generated winner is looked
up by the full signature (shapes, strides, dtypes, device of input, weight and bias).  Inside a
launch-bound model this warm path ran 1.5 % slower than `nn.Linear.forward` under Python 3.12 and 1 %
faster under 3.11, so `gemmtune.warmup` releases, by default, the layers
whose every problem runs torch's op (`release`, `dispatch.release`).

Only layers whose class uses `nn.Linear.forward` unchanged are patched: a subclass with its own forward
(LoRA adapters, quantised wrappers, ...) is left alone, as are lazy layers that are not yet materialised.
"""

from __future__ import annotations

import sys
import types
import weakref
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import InputError
from ..core.layout import effective_layout, in_layout
from ..core.validate import check_model_options
from . import autocast as _ac
from . import eager as api
from . import fp8
from .patch_report import RELEASED, ROUTE, PatchReport, patch_report
from .table import TABLE

__all__ = ["patch", "repatch", "unpatch", "patched_modules", "patch_report", "PatchReport", "set_library",
           "runs_library", "release", "repatch_released"]


# Per patched problem, once decided: what the layer runs.  Key (`_signature`): the input's, weight's
# and bias's shapes, strides and dtypes (None: no bias), the input's device and the layer's route.
# A library winner runs `F.linear` itself (what an unpatched layer runs), any other its callable on the 2-D view.
_LINEAR: dict[tuple, Callable[..., torch.Tensor]] = {}
# A generated winner's entry: key -> (Selection, its callable), so that `set_library` can send a problem to
# `F.linear` and back (the in-model check); per key sent to F.linear, the `_Decided` sets holding its size.
_ORIGIN: dict[tuple, tuple[Any, Callable[..., torch.Tensor]]] = {}
_HOLDERS: dict[tuple, list["_Decided"]] = {}
_is_compiling = torch.compiler.is_compiling  # True under Dynamo and under (non-strict) export alike
_autocast_on = _ac.enabled
_LIBRARY_UIDS = frozenset({"aten_mm", "aten_addmm", "aten_bias_addmm"})  # what F.linear runs
_linear = F.linear


class _Decided(set):
    """One patched layer's input sizes (element counts) whose problem runs `F.linear`: its warm path's
    only check.  With the weight fixed, `x.numel()` fixes the 2-D problem gemmtune tunes (M = numel / K)
    and costs less than `x.shape` and its hash.  `F.linear` is right for any input and weight, so a
    library decision needs no look at strides, dtypes or devices (a generated winner is looked up by
    the full signature); an input whose last dimension is not K raises in `F.linear` as in `nn.Linear`.
    What could make a decided size another problem empties the set: `module.to()`, `.half()`, `.cuda()`
    (through the layer's `_apply`), `clear_dispatch_cache()`, and a warm-up's recording forward sets it aside.
    A copy of a layer (`copy.deepcopy`) starts with an empty set of its own."""

    __hash__ = object.__hash__  # type: ignore[assignment]  # one per layer, in a WeakSet: identity, not contents
    __eq__ = object.__eq__  # type: ignore[assignment]

    def __deepcopy__(self, memo: dict) -> "_Decided":
        return _new_decided()


_DECIDED: "weakref.WeakSet[_Decided]" = weakref.WeakSet()
_DECIDED_ATTR = "_gemmtune_decided"


def _new_decided() -> _Decided:
    decided = _Decided()
    _DECIDED.add(decided)
    return decided


def _signature(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, route: object) -> tuple:
    """The fast path's key (see `_LINEAR`); `route`: the layer's (backends, out_layout)."""
    return (x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype), route)


def _linear_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """nn.Linear.forward with its matmul run by gemmtune.

    The parameters are read from the layer's parameter dict: `self.weight` goes through
    nn.Module.__getattr__, about half a microsecond each.  A weight kept anywhere else (a
    parametrisation, weight norm's hook) raises KeyError here and takes the general path."""
    if not _is_compiling():
        try:  # only the look-up may fail over to the general path; the call itself raises as it would
            d = self.__dict__
            params = d["_parameters"]
            w, bias = params["weight"], params["bias"]
            if x.numel() in d[_DECIDED_ATTR]:
                fn = _linear
            elif TABLE.recorder is None and not _autocast_on():  # recording: gemmtune.mm records
                key = _signature(x, w, bias, d[ROUTE])
                fn = _LINEAR[key]
                if fn is _linear:  # decided by another layer of the same shapes: this one's from now on
                    _hold(key, d[_DECIDED_ATTR])
            else:
                fn = None
        except (KeyError, TypeError, AttributeError):
            fn = None
        if fn is not None:
            return fn(x, w, bias)
    return _linear_slow(self, x)


def _apply_clearing(self: nn.Module, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """nn.Module._apply (`.to()`, `.half()`, `.cuda()`, ...) that first forgets the layer's decided sizes."""
    decided = self.__dict__.get(_DECIDED_ATTR)
    if decided is not None:
        decided.clear()
    return type(self)._apply(self, fn, *args, **kwargs)


def _linear_slow(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The first call of a problem (tunes it through gemmtune.mm / addmm), then remembers the fast path."""
    w: torch.Tensor = layer.weight  # type: ignore[assignment]
    bias: torch.Tensor | None = layer.bias  # type: ignore[assignment]
    if not isinstance(x, torch.Tensor):
        return _linear(x, w, bias)  # raises as an unpatched layer does
    route = getattr(layer, ROUTE)
    backends, layout = route
    x2 = x.unsqueeze(0) if x.dim() == 1 else x.reshape(-1, x.shape[-1])
    tensors = (x2, w.t()) if bias is None else (bias, x2, w.t())
    y = (api.mm(*tensors, backends=backends, out_layout=layout) if bias is None
         else api.addmm(*tensors, backends=backends, out_layout=layout))
    out = y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])
    if not (_is_compiling() or _autocast_on()):
        found = api.dispatched("mm" if bias is None else "addmm", tensors, backends=backends, out_layout=layout)
        _remember(x, w, bias, route, found, layer.__dict__.get(_DECIDED_ATTR))
    return out


def _remember(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, route: tuple,
              found: tuple[Any, Callable[..., torch.Tensor]] | None, decided: _Decided | None) -> None:
    """The fast path of the problem `found` decided (`_LINEAR`): `F.linear` where torch's op won and the
    layer's rows are row-major (`core.layout.effective_layout`), else the pick's callable."""
    if found is None or not isinstance(x, torch.Tensor) or x.dim() == 0:
        return
    sel, run = found
    key = _signature(x, w, bias, route)
    if sel.winner.template_uid in _LIBRARY_UIDS and effective_layout(route[1], w.shape[0], w.dtype.itemsize) is None:
        _LINEAR[key] = _linear
        if decided is not None:
            _hold(key, decided)
        return
    k, n = x.shape[-1], w.shape[0]

    def kernel(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = run(x.reshape(-1, k), w.t()) if bias is None else run(bias, x.reshape(-1, k), w.t())
        return y.reshape(*x.shape[:-1], n)

    _LINEAR[key] = kernel
    _ORIGIN[key] = (sel, kernel)


def _hold(key: tuple, decided: _Decided) -> None:
    """`decided` (a layer's) sends the input size of `key` to F.linear; remembered per key."""
    decided.add(key[0].numel())  # what x.numel() gives for that input
    holders = _HOLDERS.setdefault(key, [])
    if not any(h is decided for h in holders):
        holders.append(decided)


def set_library(selection: Any, library: bool) -> int:
    """Patched layers whose problem `selection` decided run `F.linear` (`library=True`) or the
    selection's winner again (False); returns how many problem signatures were switched.

    Example:
        >>> set_library(object(), True)
        0
    """
    switched = 0
    for key, (sel, kernel) in list(_ORIGIN.items()):
        if sel is selection:
            _LINEAR[key] = _torch_linear(key) if library else kernel
            for decided in _HOLDERS.get(key, []) if not library else ():
                decided.discard(key[0].numel())
            switched += 1
    return switched


def _torch_linear(key: tuple) -> Callable[..., torch.Tensor]:
    """torch's op for the problem of `key` (`_signature`): `F.linear`, its output laid out as the layer's
    route asks (padded rows: a copy; `core.layout.in_layout`), so the in-model check compares like for like."""
    n, layout = key[4][0], key[-1][1]
    if effective_layout(layout, n, key[6].itemsize) is None:
        return _linear

    def rows(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = _linear(x, w, bias)
        return y if y.numel() <= n else in_layout(y, layout)  # one row: any stride will do, as the pick's
    return rows


def _clear() -> None:
    _LINEAR.clear()
    _ORIGIN.clear()
    _HOLDERS.clear()
    for decided in list(_DECIDED):
        decided.clear()


_SET_ASIDE: list[tuple[_Decided, set]] = []


def _recording(started: bool) -> None:
    """A warm-up's recording forward must reach gemmtune.mm: the decided sizes are set aside for it."""
    if started:
        _SET_ASIDE[:] = [(d, set(d)) for d in list(_DECIDED)]
        for d, _ in _SET_ASIDE:
            d.clear()
    else:
        for d, sizes in _SET_ASIDE:
            d.update(sizes)
        _SET_ASIDE.clear()


TABLE.on_clear(_clear)
TABLE.on_recording(_recording)


def _patchable(m: nn.Module) -> bool:
    return (isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward
            and not isinstance(m.weight, nn.parameter.UninitializedParameter))


def patch(module: nn.Module, *, backends: Sequence[str] | str | None = None, report: bool = False,
          scaled_mm: bool = False, out_layout: str | None = None) -> nn.Module:
    """Route every `nn.Linear` in `module` through gemmtune (in place); returns `module`.

    `backends` is passed to `gemmtune.mm` / `gemmtune.addmm` (a tuple of family
    names; None: the device's defaults, which leave out NumPy's BLAS: it runs on a thread pool of
    its own, family "numpy", opt-in).  `out_layout="padded"`: a layer whose output rows are not whole
    16 bytes (an LM head of an odd vocabulary) returns a view of padded rows (`gemmtune.mm`'s `out_layout`:
    library kernels only; where M > 1 `.view(-1)` on it raises, `.contiguous()` copies); other layers are unchanged.
    Patching again sets both ("row" is None).
    The `nn.Linear` layers inside an `nn.MultiheadAttention` are left alone: it
    calls `F.linear` on their weights, so they would never reach gemmtune.
    `report=True` prints `patch_report(module)` (what is routed, what is not
    and why) to stderr.  `scaled_mm=True` also runs `module`'s forward under `dispatch.fp8.ScaledMMRouter`,
    so the `torch._scaled_mm` calls of its fp8 layers are tuned (`gemmtune.warmup` does it by itself for
    a model whose forward calls `torch._scaled_mm`; docs/FP8.md).

    Example:
        >>> import torch, gemmtune
        >>> from torch import nn
        >>> mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        >>> x = torch.randn(5, 8)
        >>> ref = mlp(x)
        >>> out = gemmtune.patch(mlp, backends=("extern",))(x)
        >>> torch.allclose(out, ref)
        True
        >>> _ = gemmtune.unpatch(mlp)
    """
    check_model_options("patch", module, backends, report=report, scaled_mm=scaled_mm)
    _route_layers(module, backends, out_layout, keep=False)
    if scaled_mm:
        fp8.route(module, backends)
    if report:
        print(patch_report(module), file=sys.stderr)
    return module


def repatch(module: nn.Module, backends: Sequence[str] | str | None, out_layout: str | None) -> nn.Module:
    """`patch(module)` with `backends` and `out_layout` where given: a patched layer keeps its own value of
    an argument that is None (what a warm-up does); returns `module`.

    Example:
        >>> import torch
        >>> lin = patch(torch.nn.Linear(4, 19), out_layout="padded")
        >>> vars(repatch(lin, ("extern",), None))[ROUTE]
        (('extern',), 'padded')
    """
    _route_layers(module, backends, out_layout, keep=True)
    return module


def _route_layers(module: nn.Module, backends: Any, out_layout: str | None, keep: bool) -> None:
    """Patch each `nn.Linear` of `module` (its route, fast path and `_apply`); `keep`: a patched layer's own
    backends or out_layout where the argument is None."""
    if backends is not None and not isinstance(backends, str):
        backends = tuple(backends)  # hashable: the dispatch key's fast path
    if out_layout not in (None, "row", "padded"):
        raise InputError(f"patch: out_layout must be None, 'row' or 'padded' (an nn.Linear's rows are row-major), "
                         f"got {out_layout!r}")
    inside_mha = {id(c) for m in module.modules() if isinstance(m, nn.MultiheadAttention) for c in m.modules()}
    for m in module.modules():
        if _patchable(m) and id(m) not in inside_mha:  # MHA calls F.linear on its weights: never routed
            old = _own_route(m) if keep else (None, None)
            route = (old[0] if backends is None else backends, old[1] if out_layout is None else out_layout)
            vars(m).pop(RELEASED, None)
            object.__setattr__(m, ROUTE, (route[0], None if route[1] == "row" else route[1]))
            object.__setattr__(m, _DECIDED_ATTR, _new_decided())
            object.__setattr__(m, "forward", types.MethodType(_linear_forward, m))
            object.__setattr__(m, "_apply", types.MethodType(_apply_clearing, m))


def _own_route(layer: nn.Module) -> tuple:
    """The (backends, out_layout) `layer` is patched with, or was before `release` (a layer released by an earlier
    gemmtune, pickled, holds `(backends,)`); (None, None) for neither."""
    own = vars(layer)
    return own[ROUTE] if ROUTE in own else (*own.get(RELEASED, ()), None, None)[:2]


def unpatch(module: nn.Module) -> nn.Module:
    """Undo `patch`: every patched or released `nn.Linear` in `module` runs `nn.Linear.forward` again,
    and a routed module (`patch(scaled_mm=True)`) its own forward; returns `module`.

    Example:
        >>> import torch, gemmtune
        >>> lin = gemmtune.patch(torch.nn.Linear(4, 2))
        >>> "forward" in vars(gemmtune.unpatch(lin))
        False
    """
    fp8.unroute(module)
    for m in module.modules():
        if ROUTE in vars(m):
            for attr in (ROUTE, _DECIDED_ATTR, "forward", "_apply"):
                vars(m).pop(attr, None)
        elif vars(m).pop(RELEASED, None):  # released by a warm-up: its lean forward goes too
            vars(m).pop("forward", None)
    return module


def runs_library(layer: nn.Module, x: Any) -> bool:
    """Whether the patched `layer`, called on `x`, runs torch's op (`F.linear`): a decided problem.

    Example:
        >>> import torch, gemmtune
        >>> runs_library(gemmtune.patch(torch.nn.Linear(4, 2)), torch.randn(3, 4))  # not yet called
        False
    """
    if ROUTE not in vars(layer) or not isinstance(x, torch.Tensor):
        return False
    key = _signature(x, layer.weight, layer.bias, vars(layer)[ROUTE])  # type: ignore[arg-type]
    return _LINEAR.get(key) is _linear


def release(layer: nn.Module, forward: Callable[..., torch.Tensor]) -> nn.Module:
    """Unpatch `layer` and give it `forward` (bound to it); `patch_report` says it was released, and
    `patch`, `unpatch` or `repatch_released` take it back.  Returns `layer`.

    Example:
        >>> import torch, gemmtune
        >>> lin = release(gemmtune.patch(torch.nn.Linear(4, 2)), torch.nn.Linear.forward)
        >>> patch_report(lin).not_routed[""].startswith("released")
        True
    """
    route = vars(layer).get(ROUTE, (None, None))
    unpatch(layer)
    object.__setattr__(layer, "forward", types.MethodType(forward, layer))
    object.__setattr__(layer, RELEASED, route)  # what `repatch_released` patches it with again
    return layer


def repatch_released(module: nn.Module) -> list[str]:
    """Patch again, each with its former backends and out_layout, the layers of `module` that `release` gave
    back; their names.

    Example:
        >>> import torch
        >>> lin = release(patch(torch.nn.Linear(4, 2), backends=("extern",)), torch.nn.Linear.forward)
        >>> repatch_released(lin), vars(lin)[ROUTE]
        ([''], (('extern',), None))
    """
    names = [name for name, m in module.named_modules() if RELEASED in vars(m)]
    for name in names:
        layer = module.get_submodule(name)
        backends, layout = _own_route(layer)
        patch(layer, backends=backends, out_layout=layout)
    return names


def patched_modules(module: nn.Module) -> list[str]:
    """Names of the layers of `module` that `patch` currently routes through gemmtune.

    Example:
        >>> import torch, gemmtune
        >>> from gemmtune.dispatch.patching import patched_modules
        >>> mlp = gemmtune.patch(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
        >>> patched_modules(mlp)
        ['0']
    """
    return [name for name, m in module.named_modules() if ROUTE in vars(m)]
