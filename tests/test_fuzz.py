"""Hypothesis fuzzing of shapes, strides, dtypes and scalars: every candidate against a float64 reference.

Deterministic (`derandomize=True`: the examples are a function of the test
source), small sizes (each dimension 1..40, batch 1..3), about 40 s in all on the 2-core CPU machine.
NaN or +-Inf sit in one element of A, B or the bias, with every alpha and beta (0 included: torch.addmm
then computes no product, or reads no bias), and no NumPy warning may escape.

- `test_every_candidate_is_correct`: every choice of every CPU template (aten,
  NumPy BLAS, numba) and, through Triton's interpreter, of the Triton template
  runs on a NaN-poisoned output and must pass `gemmtune.measure.correctness.check`
  against the float64 reference, with NaN and Inf exactly where the reference
  has them (some examples carry a NaN or Inf in an operand: data, not errors).
- `test_tune_and_eager_agree_with_the_reference`: the same problems through
  `gemmtune.tune(..., backends=...)` (store off) and the eager ops; the gate
  must reject no candidate, and the results must match the reference and torch's own op.
- `test_a_fork_child_agrees_with_torch`: problems run in the parent (numba's parallel kernels start),
  then again with new ones in a fork child, which must exit 0 (every result torch's).
- `test_torch_func_agrees_with_torch`: `torch.func.vmap` over stacked problems and `grad` of a sum,
  against torch's op under the same transforms (aten or numba winners).
- `test_a_selection_given_another_problem_refuses_or_agrees`: a Selection tuned for one drawn problem
  called on another's operands: InputError, or torch's result when the problem is the same.

0 wrong results is the pass condition.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gemmtune
from helpers import wait_child
from gemmtune.measure.correctness import check, reference
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.cpu_numba import NumbaMMTemplate, numba_available
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate
from gemmtune.templates.triton.base import triton_available
from gemmtune.templates.triton.mm import TritonMMTemplate

INTERP = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available() and triton_available()
TRITON_SPACE = [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2, num_warps=4)]
NUMBA_SPACE = [(8, 64, 8)]  # one binary per dtype; still several tiles in M and N at these sizes
FAST = gemmtune.Settings(store="off", cpu_rep_ms=1, finalist_rounds=1, min_reps=1, max_reps=3)
LAYOUTS = ("row", "col", "sliced", "expanded")
BIAS = ("row", "full", "full_col", "row2d", "col", "scalar", "expanded")
SCALARS = (-2.0, -0.5, 0.0, 0.5, 1.0, 1.5, 3.0)
COMMON = dict(derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                     HealthCheck.data_too_large])
STATS = {"problems": 0, "candidates": 0, "wrong": 0, "special": 0}
# NaN/Inf data: no NumPy warning may reach the user; Triton's interpreter (a test-only CPU stand-in for
# the GPU, built on NumPy) warns as it computes, and is exempt.
pytestmark = [pytest.mark.filterwarnings("error::RuntimeWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")]


@dataclass(frozen=True)
class Problem:
    op: str
    M: int
    K: int
    N: int
    batch: int
    dtype: torch.dtype
    a_layout: str
    b_layout: str
    bias: str
    alpha: float
    beta: float
    special: str | None  # "nan" / "inf" / "-inf" in one element of `special_in`, or None
    seed: int
    special_in: str = "a"  # "a", "b" or "bias"

    def tensors(self) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(self.seed)
        lead = (self.batch,) if self.op == "bmm" else ()
        a = _operand(lead, self.M, self.K, self.a_layout, self.dtype, g, self.special if self.special_in == "a" else None)
        b = _operand(lead, self.K, self.N, self.b_layout, self.dtype, g, self.special if self.special_in == "b" else None)
        if self.op != "addmm":
            return a, b
        bias = _bias(self.bias, self.M, self.N, self.dtype, g)
        if self.special is not None and self.special_in == "bias":
            bias = bias.clone()
            bias.view(-1)[int(torch.randint(bias.numel(), (1,), generator=g))] = float(self.special)
        return bias, a, b

    def torch_result(self, tensors: tuple) -> torch.Tensor:
        """What torch computes for this problem."""
        if self.op == "addmm":
            return torch.addmm(*tensors, alpha=self.alpha, beta=self.beta)
        return getattr(torch, self.op)(*tensors)


def _randn(shape, dtype, g):
    return torch.randn(tuple(shape), generator=g, dtype=torch.float64).to(dtype)


def _operand(lead, r, c, layout, dtype, g, special):
    """An [.., r, c] operand with the given stride pattern (a special value goes into its storage first)."""
    if layout == "row":
        base = _randn((*lead, r, c), dtype, g)
        view = lambda t: t  # noqa: E731
    elif layout == "col":
        base = _randn((*lead, c, r), dtype, g)
        view = lambda t: t.transpose(-1, -2)  # noqa: E731
    elif layout == "sliced":  # step 2 / 3 and a storage offset
        base = _randn((*lead, 2 * r + 1, 3 * c + 2), dtype, g)
        view = lambda t: t[..., 1::2, 2::3]  # noqa: E731
    else:  # expanded: stride 0 along the rows
        base = _randn((*lead, 1, c), dtype, g)
        view = lambda t: t.expand(*lead, r, c)  # noqa: E731
    if special is not None:
        flat = base.view(-1)
        flat[int(torch.randint(flat.numel(), (1,), generator=g))] = float(special)
    return view(base)


def _bias(kind, M, N, dtype, g):
    if kind == "row":
        return _randn((N,), dtype, g)
    if kind == "full":
        return _randn((M, N), dtype, g)
    if kind == "full_col":
        return _randn((N, M), dtype, g).t()
    if kind == "row2d":
        return _randn((1, N), dtype, g)
    if kind == "col":
        return _randn((M, 1), dtype, g)
    if kind == "scalar":
        return _randn((), dtype, g)
    return _randn((N,), dtype, g).expand(M, N)


@st.composite
def problems(draw, dtypes):
    op = draw(st.sampled_from(("mm", "addmm", "bmm")))
    dim = st.integers(1, 40)
    alpha = draw(st.sampled_from(SCALARS)) if op == "addmm" else 1.0
    special = draw(st.sampled_from((None,) * 6 + ("nan", "inf", "-inf")))  # with every alpha and beta, 0 included
    return Problem(
        op=op, M=draw(dim), K=draw(dim), N=draw(dim), batch=draw(st.integers(1, 3)) if op == "bmm" else 1,
        dtype=draw(st.sampled_from(dtypes)), a_layout=draw(st.sampled_from(LAYOUTS)),
        b_layout=draw(st.sampled_from(LAYOUTS)), bias=draw(st.sampled_from(BIAS)),
        alpha=alpha, beta=draw(st.sampled_from(SCALARS)) if op == "addmm" else 1.0,
        special=special, seed=draw(st.integers(0, 2**31 - 1)),
        special_in=draw(st.sampled_from(("a", "b", "bias") if op == "addmm" else ("a", "b"))))


def assert_correct(ki: KernelInputs, out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """`check` against the float64 reference, plus NaN and +-Inf exactly where the reference has them."""
    STATS["candidates"] += 1
    problem = check(ki, out, ref)
    o = out.double()
    if problem is None and not torch.equal(torch.isnan(o), torch.isnan(ref)):
        problem = "NaN pattern differs from the reference"
    inf = torch.isinf(ref)
    if problem is None and not torch.equal(o[inf], ref[inf]):
        problem = "Inf pattern differs from the reference"
    if problem is not None:
        STATS["wrong"] += 1
    assert problem is None, f"{what}: {problem} on {ki.describe()} {ki.to_dict()}"


TORCH_TOL = {torch.float16: 2e-2, torch.float32: 1e-4, torch.float64: 1e-9}


def assert_like_torch(p: Problem, out: torch.Tensor, tensors: tuple, what: str) -> None:
    """`out` is torch's result for `p`: dtype, NaN and +-Inf positions, values within the dtype's tolerance."""
    want = p.torch_result(tensors)
    try:
        assert out.dtype == want.dtype, (out.dtype, want.dtype)
        torch.testing.assert_close(out.double(), want.double(), equal_nan=True, rtol=TORCH_TOL[p.dtype],
                                   atol=TORCH_TOL[p.dtype])
    except AssertionError:
        STATS["wrong"] += 1
        raise AssertionError(f"{what}: differs from torch on {p}")


def _templates(ki: KernelInputs, triton: bool):
    pool = [AtenTemplate(ki.op), NumpyTemplate()]
    if numba_available():
        pool.append(NumbaMMTemplate(space=NUMBA_SPACE))
    if triton and INTERP:
        pool.append(TritonMMTemplate(space=TRITON_SPACE))
    return [t for t in pool if t.supports(ki)]


@pytest.fixture(autouse=True)
def _small_pool(monkeypatch):
    """The eager ops tune with the same small pool (one numba binary per dtype), store off."""
    import gemmtune.templates.registry as templates

    monkeypatch.setattr(templates, "default_templates", lambda *args, **kwargs: [
        AtenTemplate("mm"), AtenTemplate("addmm"), AtenTemplate("bmm"), NumpyTemplate(),
        NumbaMMTemplate(space=NUMBA_SPACE), _one_swizzle_triton()])
    for name, value in (("STORE", "off"), ("CPU_REP_MS", "1"), ("FINALIST_ROUNDS", "1"), ("MIN_REPS", "1"),
                        ("MAX_REPS", "3")):
        monkeypatch.setenv(f"GEMMTUNE_{name}", value)


def _one_swizzle_triton() -> TritonMMTemplate:
    """The Triton template with one runtime value: end to end through the interpreter stays quick
    (every swizzle is covered by `test_every_candidate_is_correct`)."""
    t = TritonMMTemplate(space=TRITON_SPACE)
    t.runtime_space = {"swizzle": (4,)}
    t.default_runtime = {"swizzle": 4}
    return t


# -- every candidate, launched directly -----------------------------------------------------------------------

CPU_DTYPES = (torch.float32, torch.float64)
TRITON_DTYPES = (torch.float16, torch.float32)


@settings(max_examples=150, **COMMON)
@given(p=problems(CPU_DTYPES + (torch.float16,) if INTERP else CPU_DTYPES), swizzle=st.sampled_from((1, 2, 4, 8)))
def test_every_candidate_is_correct(p, swizzle):
    tensors = p.tensors()
    ki = KernelInputs.from_tensors(p.op, *tensors, alpha=p.alpha, beta=p.beta)
    ref = reference(ki, tensors)
    STATS["problems"] += 1
    STATS["special"] += p.special is not None
    for template in _templates(ki, triton=p.dtype in TRITON_DTYPES):
        launchers = {}
        for choice in template.configs(ki):
            if template.uid == "triton_mm" and choice.runtime_dict["swizzle"] != swizzle:
                continue  # the interpreter is slow: one swizzle per example, drawn by hypothesis
            if choice.binary_key not in launchers:
                launchers[choice.binary_key] = template.compile(choice, ki, tensors)
            out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype)  # every element must be written
            launchers[choice.binary_key](tensors, out, **choice.runtime_dict)
            assert_correct(ki, out, ref, choice.name)
            STATS[template.uid] = STATS.get(template.uid, 0) + 1


# -- through tune() and the eager ops --------------------------------------------------------------------------

@settings(max_examples=50, **COMMON)
@given(p=problems(CPU_DTYPES + (torch.float16,) if INTERP else CPU_DTYPES))
def test_tune_and_eager_agree_with_the_reference(p):
    tensors = p.tensors()
    ki = KernelInputs.from_tensors(p.op, *tensors, alpha=p.alpha, beta=p.beta)
    ref = reference(ki, tensors)
    if p.dtype == torch.float16:
        backends = ("extern", "triton")  # on CPU, float16 runs through aten and the Triton interpreter
    else:
        backends = ("extern", "numba") if p.seed % 2 else ("extern", "numba", "triton")
    if "triton" in backends and not INTERP:
        backends = ("extern",)
    kw = {"alpha": p.alpha, "beta": p.beta} if p.op == "addmm" else {}
    sel = gemmtune.tune(p.op, *tensors, backends=backends, settings=FAST, **kw)
    rejected = [(t.choice.name, t.detail) for t in sel.timings if t.status == "wrong_result"]
    assert not rejected, rejected  # a rejection here is a kernel bug (or a gate false alarm)
    assert_correct(ki, sel(*tensors), ref, f"tune winner {sel.winner.name}")
    eager = getattr(gemmtune, p.op)(*tensors, backends=backends, **kw)
    assert_correct(ki, eager, ref, "eager")
    assert_like_torch(p, eager, tensors, "eager")  # torch's own semantics: NaN and Inf where torch has them
    torch.testing.assert_close(getattr(gemmtune, p.op)(*tensors, backends=backends, **kw), eager,
                               equal_nan=True)  # warm path: the same kernel, the same result



# -- the same problems in a fork child, under torch.func, and given to a Selection of another problem ----------

def _eager(p: Problem, *tensors: torch.Tensor, backends=("extern", "numba")) -> torch.Tensor:
    kw = {"alpha": p.alpha, "beta": p.beta} if p.op == "addmm" else {}
    return getattr(gemmtune, p.op)(*tensors, backends=backends, **kw)


@settings(max_examples=2, **COMMON)
@given(ps=st.lists(problems(CPU_DTYPES), min_size=6, max_size=6))
def test_a_fork_child_agrees_with_torch(ps):
    """Every problem once in the parent (numba's parallel kernels run), then all again, and new ones, in a
    fork child: its exit code says how many results differed from torch (killed: a negative code)."""
    for p in ps[:3]:
        assert_like_torch(p, _eager(p, *p.tensors()), p.tensors(), "parent")
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        wrong = 99
        try:
            torch.set_num_threads(1)  # torch's own OpenMP pool does not survive fork (DataLoader workers do this)
            wrong = 0
            for p in ps:
                try:
                    assert_like_torch(p, _eager(p, *p.tensors()), p.tensors(), "fork child")
                except AssertionError:
                    wrong += 1
        finally:
            os._exit(wrong)
    code = wait_child(pid, 180.0)
    assert code == 0, f"fork child: exit code {code} on {ps}"
    STATS["fork_problems"] = STATS.get("fork_problems", 0) + len(ps)


@settings(max_examples=25, **COMMON)
@given(p=problems(CPU_DTYPES), numba=st.booleans())
def test_torch_func_agrees_with_torch(p, numba):
    """vmap over 2 stacked copies of the problem (every operand batched), and grad of a sum, against
    torch's own op under the same transforms (NaN/Inf data included)."""
    from torch.func import grad, vmap

    backends = ("numba",) if numba else ("extern",)
    tensors = p.tensors()
    torch_op = lambda *t: p.torch_result(t)  # noqa: E731
    ours = lambda *t: _eager(p, *t, backends=backends)  # noqa: E731
    stacked = tuple(torch.stack([t, t.flip(0) if t.dim() else t]) for t in tensors)
    got = vmap(ours)(*stacked)
    want = torch.stack([torch_op(*(t[i] for t in stacked)) for i in range(2)])
    STATS["func_checks"] = STATS.get("func_checks", 0) + 2
    tol = TORCH_TOL[p.dtype]
    torch.testing.assert_close(got.double(), want.double(), equal_nan=True, rtol=tol, atol=tol)
    if p.special is None:  # gradients of NaN data are NaN on both sides: the values say nothing more
        argnums = tuple(range(len(tensors)))
        g_ours = grad(lambda *t: ours(*t).sum(), argnums=argnums)(*tensors)
        g_torch = grad(lambda *t: torch_op(*t).sum(), argnums=argnums)(*tensors)
        for x, y in zip(g_ours, g_torch):
            torch.testing.assert_close(x.double(), y.double(), rtol=tol * 10, atol=tol * 10)


def _meta(tensors: tuple) -> tuple:
    return tuple((tuple(t.shape), t.stride(), t.dtype) for t in tensors)


@settings(max_examples=25, **COMMON)
@given(p=problems(CPU_DTYPES), q=problems(CPU_DTYPES))
def test_a_selection_given_another_problem_refuses_or_agrees(p, q):
    """A Selection tuned for `p` called on `q`'s operands: InputError unless `q` is the same problem
    (op, shapes, strides, dtypes), then torch's result for `q`'s scalars as `p` had them."""
    sel = gemmtune.tune(p.op, *p.tensors(), backends=("extern", "numba"), settings=FAST,
                        **({"alpha": p.alpha, "beta": p.beta} if p.op == "addmm" else {}))
    other = q.tensors()
    STATS["foreign_calls"] = STATS.get("foreign_calls", 0) + 1
    if q.op == p.op and _meta(other) == _meta(p.tensors()):
        assert_like_torch(dataclasses.replace(q, alpha=p.alpha, beta=p.beta), sel(*other), other, "same problem")
        return
    with pytest.raises(gemmtune.InputError, match="this Selection"):
        sel(*other)
