"""Matrix-vector products in a default-mode compile, lowered as max-autotune lowers them.

A max-autotune compile turns on coordinate-descent tuning, and with it Inductor decomposes an `mm`
whose M or N is 1 into a multiply and a reduction over K, then tunes that reduction kernel by
coordinate descent (Inductor's comment there: its matrix-vector products reach peak bandwidth only so
tuned).  The reduction also fuses the pointwise op that produces the vector (an RMSNorm's scale, a
residual add), which a library GEMV cannot.  A default compile does neither, and on the Llama-shaped
stack at M = 1 that was the 9% by which gemmtune's default-mode path trailed max-autotune.

Here, inside gemmtune's window (`inductor.window`, default mode, CUDA, handler installed with
`gemv=True`), such an `mm` is lowered to the same multiply and reduction (in float32 for half
inputs, as Inductor's decomposition does), its FX node is marked, and the kernel that holds the
marked reduction, and only that kernel, is generated with coordinate-descent tuning on
(`hook_codegen`, a wrapper of Inductor's `SIMDScheduling.codegen_node_schedule`), or, with
`gemv="autotune"`, with the reduction configs of Inductor's max-autotune compiled in parallel and
timed once (`config.max_autotune_pointwise` for that kernel), which costs less than a descent.  Every other
kernel of the compile stays at default cost.

Example:
    >>> is_vector_product((1, 4096), (4096, 11008))
    True
    >>> is_vector_product((64, 4096), (4096, 11008))
    False
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch

__all__ = ["MARK", "is_vector_product", "is_outer_product", "gemv_lowering", "outer_lowering", "hook_codegen",
           "marked"]

MARK = "gemmtune_gemv"  # FX node meta key of an mm lowered here
_HALF = (torch.float16, torch.bfloat16)


def is_vector_product(a_size: Sequence[Any], b_size: Sequence[Any]) -> bool:
    """Whether `a @ b` (sizes `[M, K]` and `[K, N]`, ints) is a matrix-vector product: M or N is 1
    and the other is not (a 1 x 1 output is a dot product; Inductor's decomposition covers it too)."""
    try:
        m, n = int(a_size[0]), int(b_size[1])
    except (TypeError, ValueError, IndexError):  # symbolic sizes: not statically a vector product
        return False
    return m == 1 or n == 1


def is_outer_product(a_size: Sequence[Any], b_size: Sequence[Any]) -> bool:
    """Whether `a @ b` (sizes `[M, K]` and `[K, N]`, ints) is an outer product: K is 1, M and N are not
    (a training step's weight gradient at M = 1).

    Example:
        >>> is_outer_product((4096, 1), (1, 11008)), is_outer_product((1, 1), (1, 4096))
        (True, False)
    """
    try:
        m, k, n = int(a_size[0]), int(a_size[1]), int(b_size[1])
    except (TypeError, ValueError, IndexError):  # symbolic sizes: not statically an outer product
        return False
    return k == 1 and m != 1 and n != 1


def _static_sizes(node: Any) -> tuple[int, ...] | None:
    from torch._inductor.virtualized import V

    try:
        sizes = node.get_size()
        known = [V.graph.sizevars.statically_known_equals(s, int(s)) for s in sizes]
        return tuple(int(s) for s in sizes) if all(known) else None
    except Exception:  # noqa: BLE001 - symbolic, or not an IR node we know
        return None


TUNING = {True: {"coordinate_descent_tuning": True}, "autotune": {"max_autotune_pointwise": True}}
OUTER_TUNING = TUNING["autotune"]  # an outer product's kernel (`outer_lowering`)


def gemv_lowering(mat1: Any, mat2: Any, how: bool | str = True) -> Any:
    """Lower `mm(mat1, mat2)` (Inductor IR, one of M, N equal to 1) as a multiply and a sum over K,
    and mark the FX node being lowered so its reduction kernel is tuned: `how` True by coordinate
    descent, "autotune" by timing the reduction configs Inductor's max-autotune would try."""
    from torch._inductor.lowering import lowerings
    from torch._inductor.virtualized import V

    aten, prims = torch.ops.aten, torch.ops.prims
    dtype = mat1.get_dtype()
    wide = torch.float32 if dtype in _HALF else dtype

    def cast(x: Any, to: torch.dtype) -> Any:
        return x if x.get_dtype() == to else lowerings[prims.convert_element_type.default](x, to)

    a = lowerings[aten.unsqueeze.default](cast(mat1, wide), 2)
    b = lowerings[aten.unsqueeze.default](cast(mat2, wide), 0)
    out = lowerings[aten.sum.dim_IntList](lowerings[aten.mul.Tensor](a, b), [1])
    node = getattr(V.graph, "current_node", None)
    if node is not None:
        node.meta[MARK] = TUNING[how]
    return cast(out, dtype)


def outer_lowering(mat1: Any, mat2: Any) -> Any:
    """Lower `mm(mat1, mat2)` (Inductor IR, K equal to 1) as the broadcast multiply it is, a pointwise
    kernel that fuses with its neighbours (newer Inductor decomposes such an mm so on a GPU itself).
    The product of two values is the same whether rounded from float32 or computed in their dtype.
    The FX node is marked so that its kernel's configs are timed once, as max-autotune's pointwise
    kernels are (`OUTER_TUNING`)."""
    from torch._inductor.lowering import lowerings
    from torch._inductor.virtualized import V

    node = getattr(V.graph, "current_node", None)
    if node is not None:
        node.meta[MARK] = dict(OUTER_TUNING)
    return lowerings[torch.ops.aten.mul.Tensor](mat1, mat2)


def applies(mat1: Any, mat2: Any, kwargs: dict, test: Callable[[Sequence[Any], Sequence[Any]], bool]
            = is_vector_product) -> bool:
    """Whether this `mm` lowering call is a plain product of one floating dtype and static sizes that
    `test` accepts (by default a matrix-vector product; `is_outer_product` for K = 1)."""
    if kwargs.get("layout") is not None or kwargs.get("out_dtype") is not None:
        return False
    a, b = _static_sizes(mat1), _static_sizes(mat2)
    try:
        same = mat1.get_dtype() == mat2.get_dtype() and mat1.get_dtype().is_floating_point
    except Exception:  # noqa: BLE001 - not the IR we know
        return False
    return bool(same and a and b and len(a) == 2 and len(b) == 2 and test(a, b))


def marked(node_schedule: Sequence[Any]) -> dict[str, bool]:
    """The config patch of a kernel whose node schedule holds a node lowered from a marked `mm` (its
    IR's origins); empty for any other kernel."""
    patch: dict[str, bool] = {}
    for entry in node_schedule:
        ir = getattr(entry, "node", None)
        for origin in getattr(ir, "origins", None) or ():
            found = getattr(origin, "meta", {}).get(MARK)
            if isinstance(found, dict):
                patch.update(found)
    return patch


def _schedule_of(args: tuple) -> Sequence[Any]:
    first = args[0] if args else ()
    return getattr(first, "node_schedule", first) or ()


def _wrap_codegen(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def codegen_node_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        from torch._inductor import config

        try:
            patch = marked(_schedule_of(args))
        except Exception:  # noqa: BLE001 - a schedule we cannot read: generate it as Inductor would
            patch = {}
        if not patch:
            return fn(self, *args, **kwargs)
        with config.patch(patch):
            return fn(self, *args, **kwargs)

    codegen_node_schedule.__gemmtune_gemv__ = fn  # type: ignore[attr-defined]
    return codegen_node_schedule


def hook_codegen() -> bool:
    """Wrap Inductor's `SIMDScheduling.codegen_node_schedule` once per process, so the kernel of a
    marked reduction is generated with coordinate-descent tuning; False where this torch has no such
    method (the rewrite is then not used: `window` asks `hook_codegen()` first)."""
    try:
        from torch._inductor.codegen.simd import SIMDScheduling
    except Exception:  # noqa: BLE001 - no Inductor SIMD codegen in this torch
        return False
    fn = getattr(SIMDScheduling, "codegen_node_schedule", None)
    if fn is None:
        return False
    if not hasattr(fn, "__gemmtune_gemv__"):
        setattr(SIMDScheduling, "codegen_node_schedule", _wrap_codegen(fn))  # once: the wrapper is marked
    return True
