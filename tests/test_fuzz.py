"""Hypothesis fuzzing of shapes, strides, dtypes and scalars: every candidate against a float64 reference.

Deterministic (`derandomize=True`: the examples are a function of the test
source), small sizes (each dimension 1..40, batch 1..3), 15-20 s in all (150 + 50 examples).

- `test_every_candidate_is_correct`: every choice of every CPU template (aten,
  NumPy BLAS, numba) and, through Triton's interpreter, of the Triton template
  runs on a NaN-poisoned output and must pass `gemmtune.bench.correctness.check`
  against the float64 reference, with NaN and Inf exactly where the reference
  has them (some examples carry a NaN or Inf in an operand: data, not errors).
- `test_tune_and_eager_agree_with_the_reference`: the same problems through
  `gemmtune.tune(..., backends=...)` (store off) and the eager ops; the gate
  must reject no candidate, and the results must match.

0 wrong results is the pass condition.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gemmtune
from gemmtune.bench.correctness import check, reference
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
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # NaN/Inf data: no NumPy warning may reach the user


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
    special: str | None  # "nan" / "inf" / "-inf" in one element of A, or None
    seed: int

    def tensors(self) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(self.seed)
        lead = (self.batch,) if self.op == "bmm" else ()
        a = _operand(lead, self.M, self.K, self.a_layout, self.dtype, g, self.special)
        b = _operand(lead, self.K, self.N, self.b_layout, self.dtype, g, None)
        if self.op != "addmm":
            return a, b
        return _bias(self.bias, self.M, self.N, self.dtype, g), a, b


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
    special = draw(st.sampled_from((None,) * 6 + ("nan", "inf", "-inf")))
    if op == "addmm" and alpha == 0.0:
        special = None  # alpha=0 would turn an Inf product into NaN in the reference only (BLAS skips it)
    return Problem(
        op=op, M=draw(dim), K=draw(dim), N=draw(dim), batch=draw(st.integers(1, 3)) if op == "bmm" else 1,
        dtype=draw(st.sampled_from(dtypes)), a_layout=draw(st.sampled_from(LAYOUTS)),
        b_layout=draw(st.sampled_from(LAYOUTS)), bias=draw(st.sampled_from(BIAS)),
        alpha=alpha, beta=draw(st.sampled_from(SCALARS)) if op == "addmm" else 1.0,
        special=special, seed=draw(st.integers(0, 2**31 - 1)))


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
    torch.testing.assert_close(getattr(gemmtune, p.op)(*tensors, backends=backends, **kw), eager,
                               equal_nan=True)  # warm path: the same kernel, the same result

