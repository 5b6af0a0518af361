"""Inductor's lookup keys for a gemmtune problem, made by the installed torch's own key function.

Inductor keys a GEMM by its input nodes' dtypes, sizes and strides, its scalars and the op name
(`LookupTableChoices.make_lookup_key`).  Here the nodes are built as Inductor builds them
(`ir.InputBuffer` with a `FixedLayout`, in an `MMKernelInputs`) and handed to that function, so a
change of key format in torch is followed, not copied.  addmm is asked for under two keys: the
library kernels see the bias as given, the Triton templates see it expanded to [M, N].

Example:
    >>> import torch
    >>> from gemmtune.core.inputs import KernelInputs
    >>> ki = KernelInputs.from_tensors("mm", torch.randn(8, 4), torch.randn(4, 2))
    >>> problem_keys(ki) if available() else ("((torch.float32, [8, 4], [4, 1]), (torch.float32, [4, 2], [2, 1]))+mm",)
    ('((torch.float32, [8, 4], [4, 1]), (torch.float32, [4, 2], [2, 1]))+mm',)
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import torch

from ..core.inputs import KernelInputs, TensorMeta
from .compat import available, require  # noqa: F401 - `available` is used by the doctest

__all__ = ["problem_keys", "mm_keys", "inductor_key", "key_choices", "expanded_bias"]


class _Sizes:
    """The part of a GraphLowering the key function reads (`V.graph.sizevars`), for plain ints."""

    def __init__(self) -> None:
        from torch._inductor.sizevars import SizeVarAllocator

        self.sizevars = SizeVarAllocator()


def key_choices() -> Any:
    """A `LookupTableChoices` whose device key is never None, so its key function runs off CUDA too
    (the stock one answers None on a CPU or without a GPU; the key text is otherwise its own)."""
    base = require()

    class _KeyChoices(base):  # type: ignore[misc, valid-type]
        @staticmethod
        def _get_device_key(device: torch.device) -> str | None:
            if device.type == "cuda" and torch.cuda.is_available():
                return base._get_device_key(device)
            return device.type

    return _KeyChoices()


def inductor_key(kernel_inputs: Any, op_name: str) -> str | None:
    """The device-agnostic key of Inductor's own `KernelInputs` (inside a lowering)."""
    return key_choices().make_lookup_key(kernel_inputs, op_name, include_device=False)


def _node(i: int, meta: TensorMeta) -> Any:
    from torch._inductor import ir

    layout = ir.FixedLayout(torch.device(meta.device), meta.dtype, list(meta.size), list(meta.stride))
    return ir.InputBuffer(name=f"gemmtune_arg{i}", layout=layout)


def expanded_bias(ki: KernelInputs) -> TensorMeta:
    """addmm's bias as Inductor's templates see it: expanded to [M, N], broadcast dims of stride 0."""
    bias = ki.operands[0]
    size, stride = list(bias.size), list(bias.stride)
    while len(size) < 2:
        size, stride = [1, *size], [0, *stride]
    out = (ki.M, ki.N)
    stride = [0 if n == 1 and o != 1 else s for n, s, o in zip(size, stride, out)]
    return TensorMeta(out, tuple(stride), bias.dtype, bias.device)


def _spellings(value: float) -> list[Any]:
    """How a scalar can reach the key: an integral value as an int (torch's defaults) or a float."""
    return [int(value), float(value)] if float(value).is_integer() else [float(value)]


def _key_for(operands: Sequence[TensorMeta], op: str, scalars: dict[str, Any]) -> str:
    from torch._inductor.kernel_inputs import MMKernelInputs
    from torch._inductor.virtualized import V

    with V.set_graph_handler(_Sizes()):  # type: ignore[arg-type]
        nodes = [_node(i, m) for i, m in enumerate(operands)]
        key = key_choices().make_lookup_key(MMKernelInputs(nodes, scalars=scalars or None), op,
                                            include_device=False)
    assert key is not None
    return key


def problem_keys(ki: KernelInputs) -> tuple[str, ...]:
    """Every key under which Inductor asks for this problem (device-agnostic), most likely first."""
    if ki.op != "addmm":
        return (_key_for(ki.operands, ki.op, {}),)
    keys: list[str] = []
    for alpha, beta in itertools.product(_spellings(ki.alpha), _spellings(ki.beta)):
        for bias in (ki.operands[0], expanded_bias(ki)):
            key = _key_for((bias, *ki.operands[1:]), "addmm", {"alpha": alpha, "beta": beta})
            if key not in keys:
                keys.append(key)
    return tuple(keys)




def mm_keys(ki: KernelInputs) -> tuple[str, ...]:
    """The keys of an addmm's plain `a @ b` (what Inductor asks after unfusing the bias); () otherwise."""
    if ki.op != "addmm":
        return ()
    return (_key_for(ki.operands[1:], "mm", {}),)
