"""`tile_order`: two swizzles with the same value give the same tiles to the same programs.  Checked
against the kernels' own `swizzled_tile`, run by Triton's interpreter on CPU."""

import os

import pytest
import torch

pytest.importorskip("triton")
if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests run on machines without CUDA", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gemmtune.templates.base import tile_order  # noqa: E402
from gemmtune.templates.triton.base import SWIZZLES  # noqa: E402
from gemmtune.templates.triton.common_kernel import swizzled_tile  # noqa: E402


@triton.jit
def _tiles(OUT, grid_m, grid_n, GROUP_M):
    pid = tl.program_id(0)
    pid_m, pid_n = swizzled_tile(pid, grid_m, grid_n, GROUP_M)
    tl.store(OUT + 2 * pid, pid_m)
    tl.store(OUT + 2 * pid + 1, pid_n)


def tiles(grid_m: int, grid_n: int, swizzle: int) -> list[tuple[int, int]]:
    out = torch.full((grid_m * grid_n, 2), -1, dtype=torch.int32)
    _tiles[(grid_m * grid_n,)](out, grid_m, grid_n, swizzle)
    return [tuple(r) for r in out.tolist()]


@pytest.mark.parametrize("grid_m,grid_n", [(1, 5), (2, 3), (3, 4), (5, 2), (9, 3)])
def test_swizzles_of_one_tile_order_map_every_program_to_the_same_tile(grid_m, grid_n):
    by_order: dict[int, list[tuple[int, int]]] = {}
    for s in SWIZZLES:
        got = tiles(grid_m, grid_n, s)
        assert sorted(got) == [(m, n) for m in range(grid_m) for n in range(grid_n)]  # every tile once
        by_order.setdefault(tile_order(s, grid_m), got)
        assert got == by_order[tile_order(s, grid_m)], (s, grid_m)
    # and different orders are different schedules: the order counts only what really changes
    schedules = list(by_order.values())
    assert len({tuple(x) for x in schedules}) == len(schedules)
