"""Give the patched layers that torch's op won back to torch: what `gemmtune.warmup` does by default.

A patched layer pays for its checks on every call (`dispatch.patching`): inside a launch-bound model
under Python 3.12 that cost 1.5 % more than `nn.Linear.forward`.  A
layer whose every problem runs torch's op gains nothing from those checks, so `release_library_layers`
takes its patch off and gives it `lean_forward`: the same `F.linear` call as `nn.Linear.forward`, on
the weight and bias read from the parameter dict, which skips the two `Module.__getattr__` look-ups.
A new input shape at a released layer runs torch's op untuned, as in an unpatched model;
`gemmtune.patch` (or a warm-up with `release=False`) routes it again.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .patching import patched_modules, release, runs_library

__all__ = ["release_library_layers", "lean_forward"]

_nn_forward = nn.Linear.forward


def lean_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`nn.Linear.forward` on the parameter dict: `F.linear(x, weight, bias)`.

    A weight kept anywhere else (a parametrisation, weight norm's hook, a wrapper that sets plain
    tensors) is not in the dict: then `nn.Linear.forward` itself runs.  Named `forward`, so that a
    pickled layer loads with torch's own forward.

    Example:
        >>> import types, torch
        >>> lin = torch.nn.Linear(4, 3); x = torch.randn(2, 4)
        >>> lin.forward = types.MethodType(lean_forward, lin)
        >>> torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))
        True
    """
    p = self._parameters
    try:
        w, b = p["weight"], p["bias"]
    except KeyError:
        return _nn_forward(self, x)  # type: ignore[arg-type]
    return F.linear(x, w, b)  # type: ignore[arg-type]  # the weight entry is never None


lean_forward.__name__ = lean_forward.__qualname__ = "forward"


def release_library_layers(module: nn.Module, forward: Callable[[], Any],
                           keep: Callable[[nn.Module, torch.Tensor], bool] | None = None) -> list[str]:
    """Release the layers of `module` whose every problem runs torch's op (`F.linear`); their names.

    `forward` runs once (under `torch.no_grad()`) to see which input each patched layer meets.  A
    layer that met only problems decided for the library kernel loses its patch and gets
    `lean_forward`: it then computes what an unpatched layer computes, with the same kernel, and a
    new input shape there is no longer tuned.  Layers with a generated pick, or not called by
    `forward`, stay patched, and so do those for which `keep(layer, input)` says so (a range warm-up's
    layers with a generated pick in some bucket of M).  `gemmtune.patch` or `gemmtune.unpatch` undo it.

    Example:
        >>> import torch, gemmtune
        >>> from gemmtune.dispatch.patching import patched_modules
        >>> mlp = gemmtune.patch(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), backends=("extern",))
        >>> x = torch.randn(3, 8)
        >>> _ = mlp(x)
        >>> release_library_layers(mlp, lambda: mlp(x))  # torch's kernels only: F.linear runs the pick
        ['0']
        >>> patched_modules(mlp)
        []
    """
    patched = set(patched_modules(module))
    layers = {id(m): name for name, m in module.named_modules() if name in patched}
    library: dict[str, bool] = {}

    def ran(layer: nn.Module, args: tuple, _: Any) -> None:  # after the call: its decision is remembered
        name = layers[id(layer)]  # (called with a keyword input: not looked at, so kept patched)
        library[name] = (library.get(name, True) and bool(args) and runs_library(layer, args[0])
                         and (keep is None or not keep(layer, args[0])))

    handles = [m.register_forward_hook(ran) for m in module.modules() if id(m) in layers]
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in handles:
            h.remove()
    released = [name for name, on_library in library.items() if on_library]
    for name in released:
        release(module.get_submodule(name), lean_forward)
    return released
