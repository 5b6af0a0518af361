"""The runtime tile order of `cutlass_hopper`: pure integer arithmetic, so the same function runs in
Python (tests, this docstring) and inside the CuTe DSL kernel on `Int32` values (`min_fn=cutlass.min`).

Example:
    >>> [tile_order(i, 4, 2, 2, 0) for i in range(4)]
    [(0, 0), (1, 0), (0, 1), (1, 1)]
"""

from __future__ import annotations

from typing import Any, Callable


def tile_order(idx: Any, tiles_m: Any, tiles_n: Any, swizzle: Any, raster: Any,
               min_fn: Callable[[Any, Any], Any] = min) -> tuple[Any, Any]:
    """The (m, n) tile of linear index `idx`.  raster 0 ("m"): groups of `swizzle` tile rows, M
    fastest inside a group (triton's GROUP_M); raster 1 ("n"): groups of `swizzle` tile columns, N
    fastest.  Swizzle 1 is plain row- (raster 0: N-outer) or column-major order.  Branch-free: the
    raster is a multiplier, so the kernel takes it as a runtime argument.

    Example:
        >>> [tile_order(i, 2, 4, 2, 1) for i in range(4)]
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    major = tiles_m * (1 - raster) + tiles_n * raster  # the dimension grouped by `swizzle`
    minor = tiles_n * (1 - raster) + tiles_m * raster
    per_group = swizzle * minor
    first = (idx // per_group) * swizzle
    size = min_fn(major - first, swizzle)
    p = first + (idx % per_group) % size
    q = (idx % per_group) // size
    return p * (1 - raster) + q * raster, q * (1 - raster) + p * raster
