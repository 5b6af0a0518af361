"""The correctness gate's cheap path (`verdict` against a `Reference` computed once per problem) decides
exactly as the full float64 `check`: a clear pass in the output dtype, everything else by `check`."""

import pytest
import torch

from gemmtune.measure.correctness import Reference, check, tolerance, verdict
from gemmtune.core.inputs import KernelInputs


def _problem(M=96, K=80, N=72, dtype=torch.float32, scale=1.0):
    a, b = torch.randn(M, K, dtype=dtype) * scale, torch.randn(K, N, dtype=dtype) * scale
    ki = KernelInputs.from_tensors("mm", a, b)
    return ki, a @ b, Reference.of(ki, (a, b))


def _wrong_outputs(good: torch.Tensor, tol: float):
    """Outputs a faulty kernel could give: one bad element in the last (edge) tile, an unwritten one, a
    skipped K block's worth of error, an infinity, a uniform error just above the tolerance."""
    last = good.clone()
    last[-1, -1] += 1.0
    unwritten = good.clone()
    unwritten[37, 5] = float("nan")
    infinite = good.clone()
    infinite[0, 0] = float("inf")
    drift = good * (1 + 3 * tol)
    tile = good.clone()
    tile[64:, 64:] *= 0.9
    return {"last element": last, "unwritten": unwritten, "inf": infinite, "drift": drift, "tile": tile}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cheap_path_rejects_every_wrong_output_the_full_check_rejects(dtype):
    ki, good, ref = _problem(dtype=dtype)
    assert verdict(ki, good, ref) is None and check(ki, good, ref.exact) is None
    for name, out in _wrong_outputs(good, tolerance(ki)).items():
        reason = verdict(ki, out, ref)
        assert reason is not None, name
        assert reason == check(ki, out, ref.exact), name  # the very reason the full check gives


def test_a_reference_that_overflows_the_output_dtype_takes_the_full_path():
    a, b = (torch.randn(24, 16) * 300).half(), (torch.randn(16, 20) * 300).half()
    ki = KernelInputs.from_tensors("mm", a, b)
    ref = Reference.of(ki, (a, b))
    want = torch.mm(a.float(), b.float()).half()
    assert torch.isinf(want).any() and ref.rounded is None
    assert verdict(ki, want, ref) == check(ki, want, ref.exact)


def test_an_output_of_another_shape_is_refused():
    ki, good, ref = _problem()
    assert verdict(ki, good[:-1], ref) == check(ki, good[:-1], ref.exact) is not None
