"""torch.func transforms over gemmtune's eager ops: grad, jacrev, jacfwd and vmap give torch's results.

A generated winner (numba here) runs inside an autograd.Function with `setup_context`, `jvp` and a
batching rule; an aten winner is torch's own op.  The first call of a problem may come under a
transform: nothing is tuned on wrapped operands, the plain problem is tuned one level down.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, jacfwd, jacrev, vmap

import gemmtune
from gemmtune.templates.cpu_numba import NumbaMMTemplate
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate

BACKENDS = [("extern",), ("numba",)]
pytestmark = pytest.mark.usefixtures("memory_store")


@pytest.fixture(autouse=True)
def _small_pool(monkeypatch):
    import gemmtune.templates.registry as templates

    monkeypatch.setattr(templates, "default_templates", lambda *args, **kwargs: [
        AtenTemplate("mm"), AtenTemplate("addmm"), AtenTemplate("bmm"), NumpyTemplate(),
        NumbaMMTemplate(space=[(8, 64, 8)])])
    for name, value in (("CPU_REP_MS", "1"), ("FINALIST_ROUNDS", "1"), ("MIN_REPS", "1"), ("MAX_REPS", "3")):
        monkeypatch.setenv(f"GEMMTUNE_{name}", value)


def ops(backends):
    """(gemmtune function, torch function) pairs per op, gemmtune's bound to `backends`."""
    return {
        "mm": (lambda a, b: gemmtune.mm(a, b, backends=backends), torch.mm),
        "bmm": (lambda a, b: gemmtune.bmm(a, b, backends=backends), torch.bmm),
        "addmm": (lambda c, a, b: gemmtune.addmm(c, a, b, beta=0.5, alpha=2.0, backends=backends),
                  lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0)),
    }


def operands(op):
    if op == "bmm":
        return torch.randn(2, 6, 4, dtype=torch.float64), torch.randn(2, 4, 5, dtype=torch.float64)
    a, b = torch.randn(6, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    return (torch.randn(5, dtype=torch.float64), a, b) if op == "addmm" else (a, b)


def winners():
    return {s.winner.template_uid for s in gemmtune.dispatch.eager.selections().values()}


@pytest.mark.parametrize("backends", BACKENDS, ids="-".join)
@pytest.mark.parametrize("op", ["mm", "bmm", "addmm"])
@pytest.mark.parametrize("transform", ["grad", "jacrev", "jacfwd"])
def test_derivatives_match_torch(op, backends, transform):
    ours, theirs = ops(backends)[op]
    args = operands(op)
    argnums = tuple(range(len(args)))
    if transform == "grad":
        got = grad(lambda *t: ours(*t).sin().sum(), argnums=argnums)(*args)  # the first call comes under grad
        want = grad(lambda *t: theirs(*t).sin().sum(), argnums=argnums)(*args)
    else:
        fn = jacrev if transform == "jacrev" else jacfwd
        got, want = fn(ours, argnums=argnums)(*args), fn(theirs, argnums=argnums)(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert winners() and (winners() <= {"aten_mm", "aten_bmm", "aten_addmm", "numpy_blas"}
                          if backends == ("extern",) else "numba_mm" in winners())


@pytest.mark.parametrize("backends", BACKENDS, ids="-".join)
@pytest.mark.parametrize("op,in_dims", [("mm", (0, None)), ("mm", (None, 1)), ("mm", (0, 0)), ("bmm", (0, None)),
                                        ("bmm", (1, 0)), ("addmm", (None, 0, None)), ("addmm", (0, None, 0)),
                                        ("addmm", (0, 0, 0))])
def test_vmap_matches_torch(op, in_dims, backends):
    ours, theirs = ops(backends)[op]
    args = tuple(t if d is None else torch.stack([torch.randn_like(t) for _ in range(3)], dim=d)
                 for t, d in zip(operands(op), in_dims))
    got = vmap(ours, in_dims=in_dims)(*args)
    torch.testing.assert_close(got, vmap(theirs, in_dims=in_dims)(*args))
    torch.testing.assert_close(vmap(ours, in_dims=in_dims)(*args), got)  # again, warm


@pytest.mark.parametrize("backends", BACKENDS, ids="-".join)
def test_vmap_of_addmm_keeps_torch_semantics_for_zero_scalars(backends):
    bias, a, b = torch.randn(3, 5), torch.randn(3, 6, 4), torch.randn(4, 5)
    a[1, 2, 3] = float("nan")
    for alpha, beta in ((0.0, 1.0), (1.0, 0.0), (0.0, 0.0)):
        bias_nan = bias.clone()
        bias_nan[0, 0] = float("nan")
        got = vmap(lambda c, x: gemmtune.addmm(c, x, b, alpha=alpha, beta=beta, backends=backends))(bias_nan, a)
        # per example, as torch.addmm computes it (torch's own vmap of addmm propagates the NaN for alpha=0)
        want = torch.stack([torch.addmm(c, x, b, alpha=alpha, beta=beta) for c, x in zip(bias_nan, a)])
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("backends", BACKENDS, ids="-".join)
def test_a_first_call_under_vmap_tunes_the_plain_problem(backends):
    a, b = torch.randn(3, 6, 4), torch.randn(4, 5)
    got = vmap(lambda x: gemmtune.mm(x, b, backends=backends))(a)  # nothing tuned before: no NoCandidatesError
    torch.testing.assert_close(got, a @ b)
    stats = gemmtune.dispatch_stats()
    assert stats["tunes"] == 1 and all("18x4" in k or "6x4" in k for k in stats["selections"]), stats
