"""`nn.Linear` forwards without gemmtune's dispatch: the eager controls of bench/protocol.py and the
variants of bench/linear_forward_cost.py.  Each reads the weight and bias from the layer's parameter
dict, as gemmtune's patched layer does, so it skips `Module.__getattr__`; "lean" is the forward a
warm-up releases a layer to (`gemmtune.dispatch.release.lean_forward`), set on a never-patched layer.

    >>> import torch
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(4, 3))
    >>> x = torch.randn(2, 4); ref = mlp(x)
    >>> set_forwards(mlp, "subclass"), torch.equal(mlp(x), ref)
    (1, True)
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

_is_compiling = torch.compiler.is_compiling


def bare(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`F.linear` on the parameter dict."""
    p = self._parameters
    return F.linear(x, p["weight"], p["bias"])


def checked(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`bare` behind `torch.compiler.is_compiling()`, the test gemmtune's warm path makes first."""
    if not _is_compiling():
        p = self._parameters
        return F.linear(x, p["weight"], p["bias"])
    raise AssertionError("a control of eager runs only")


def decided(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`bare` behind a decided-size test (`x.numel()` in a set of the layer's), gemmtune's other test."""
    if x.numel() in self._sizes:
        p = self._parameters
        return F.linear(x, p["weight"], p["bias"])
    raise AssertionError("an input size the control was not given")


class BareLinear(nn.Linear):
    """`nn.Linear` with `bare` as its forward, at class level."""

    forward = bare  # type: ignore[assignment]


FORWARDS = {"closure": bare, "check": checked, "decided": decided}


def set_forwards(model: nn.Module, kind: str) -> int:
    """Give every plain `nn.Linear` of `model` the forward `kind` names (a key of `FORWARDS`: an
    instance forward; "subclass": `BareLinear`; "lean": gemmtune's released layer); `decided` accepts each layer's in-features (a
    [1, 1, K] input).  Returns how many layers."""
    layers = [m for m in model.modules() if type(m) is nn.Linear]
    for m in layers:
        if kind == "subclass":
            m.__class__ = BareLinear
        elif kind == "lean":
            from gemmtune.dispatch.patching import release
            from gemmtune.dispatch.release import lean_forward

            release(m, lean_forward)
        else:
            object.__setattr__(m, "_sizes", {m.in_features})
            object.__setattr__(m, "forward", types.MethodType(FORWARDS[kind], m))
    return len(layers)
