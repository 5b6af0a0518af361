"""The eager API (gemmtune.mm/addmm/bmm), its custom ops, torch.compile and patch()."""

import threading

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.dispatch import eager as api
from gemmtune.dispatch.eager import addmm, bmm, clear_dispatch_cache, dispatch_stats, mm
from gemmtune.core.errors import BackendError, InputError, LayoutError
from gemmtune.dispatch.patching import patch, patched_modules, unpatch

EXTERN = ("extern",)
# Inductor (torch 2.13) imports TorchScript helpers that warn on import; not ours.
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")


@pytest.fixture(autouse=True)
def _fresh_dispatch():
    clear_dispatch_cache()
    yield
    clear_dispatch_cache()


@pytest.fixture
def tune_calls(monkeypatch):
    """Every gemmtune.tune call the API makes, as (op, shapes)."""
    calls = []
    real = gemmtune.tune

    def spy(op, *tensors, **kwargs):
        calls.append((op, tuple(tuple(t.shape) for t in tensors)))
        return real(op, *tensors, **kwargs)

    monkeypatch.setattr(gemmtune.engine, "tune", spy)
    return calls


# -- results match torch ---------------------------------------------------------------------------

@pytest.mark.parametrize("a_t,b_t", [(False, False), (False, True), (True, False), (True, True)])
def test_mm_matches_torch_with_transposed_inputs(a_t, b_t):
    M, K, N = 7, 5, 6
    a = torch.randn(K, M).t() if a_t else torch.randn(M, K)
    b = torch.randn(N, K).t() if b_t else torch.randn(K, N)
    torch.testing.assert_close(mm(a, b, backends=EXTERN), a @ b)
    torch.testing.assert_close(mm(a, b, backends=EXTERN), a @ b)  # warm path


@pytest.mark.parametrize("bias_shape", [(6,), (7, 6), (1, 6), (7, 1), ()])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (2.0, 0.5), (1, 0)])
def test_addmm_matches_torch(bias_shape, alpha, beta):
    bias, a, b = torch.randn(bias_shape), torch.randn(7, 5), torch.randn(6, 5).t()
    want = torch.addmm(bias, a, b, beta=beta, alpha=alpha)
    for _ in range(2):
        torch.testing.assert_close(addmm(bias, a, b, beta=beta, alpha=alpha, backends=EXTERN), want)
    assert dispatch_stats()["hits"] == 1


@pytest.mark.parametrize("b_t", [False, True])
def test_bmm_matches_torch(b_t):
    a = torch.randn(3, 4, 5)
    b = torch.randn(3, 6, 5).transpose(1, 2) if b_t else torch.randn(3, 5, 6)
    for _ in range(2):
        torch.testing.assert_close(bmm(a, b, backends=EXTERN), torch.bmm(a, b))
    assert dispatch_stats()["hits"] == 1


def test_default_backends_on_cpu_include_numba_and_match_torch(tune_calls):
    a, b, bias = torch.randn(24, 40), torch.randn(40, 72), torch.randn(72)
    torch.testing.assert_close(mm(a, b), a @ b)
    torch.testing.assert_close(addmm(bias, a, b, beta=0.5, alpha=1.5), torch.addmm(bias, a, b, beta=0.5, alpha=1.5))
    x, y = torch.randn(2, 24, 40), torch.randn(2, 40, 72)
    torch.testing.assert_close(bmm(x, y), torch.bmm(x, y))
    families = {t.choice.family for sel in api.selections().values() for t in sel.timings}
    assert {"extern", "numba"} <= families
    assert len(tune_calls) == 3


# -- dispatch --------------------------------------------------------------------------------------

def test_second_call_dispatches_without_tuning(tune_calls):
    a, b = torch.randn(8, 4), torch.randn(4, 8)
    first = mm(a, b, backends=EXTERN)
    a2, b2 = torch.randn(8, 4), torch.randn(4, 8)  # new tensors, same problem
    second = mm(a2, b2, backends=EXTERN)
    torch.testing.assert_close(second, a2 @ b2)
    assert first.shape == second.shape
    assert tune_calls == [("mm", ((8, 4), (4, 8)))]
    s = dispatch_stats()
    assert (s["hits"], s["misses"], s["tunes"]) == (1, 1, 1)
    assert list(s["selections"].values()) == ["aten_mm"]


def test_strides_dtypes_scalars_backends_and_layout_are_part_of_the_key(tune_calls):
    a, b = torch.randn(8, 4), torch.randn(4, 8)
    mm(a, b, backends=EXTERN)
    mm(a, torch.randn(8, 4).t(), backends=EXTERN)  # other strides
    mm(a.double(), b.double(), backends=EXTERN)  # other dtype
    mm(a, b, backends=EXTERN, out_layout="col")  # other layout
    bias = torch.randn(8)
    addmm(bias, a, b, backends=EXTERN)
    addmm(bias, a, b, alpha=2.0, backends=EXTERN)  # other scalar
    assert len(tune_calls) == 6 and dispatch_stats()["hits"] == 0
    for _ in range(2):
        mm(a, torch.randn(8, 4).t(), backends=EXTERN)
        addmm(bias, a, b, alpha=2.0, backends=EXTERN)
    assert len(tune_calls) == 6 and dispatch_stats()["hits"] == 4


def test_spellings_of_one_problem_share_one_tuning(tune_calls):
    a, b = torch.randn(8, 4), torch.randn(4, 8)
    mm(a, b, backends=EXTERN)
    mm(a, b, backends="extern")  # the custom ops' spelling
    mm(a, b, backends=["extern"])  # unhashable: slow path, still no second tuning
    addmm(torch.randn(8), a, b, alpha=1, beta=1, backends=EXTERN)
    addmm(torch.randn(8), a, b, alpha=1.0, beta=1.0, backends=EXTERN)
    assert [op for op, _ in tune_calls] == ["mm", "addmm"]


def test_first_call_is_tuned_once_across_threads(tune_calls):
    a, b = torch.randn(16, 8), torch.randn(8, 16)
    barrier, results, errors = threading.Barrier(6), [], []

    def work():
        try:
            barrier.wait()
            results.append(mm(a, b, backends=EXTERN))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6
    assert len(tune_calls) == 1
    for r in results:
        torch.testing.assert_close(r, a @ b)


def test_clear_dispatch_cache_tunes_again(tune_calls):
    a, b = torch.randn(8, 4), torch.randn(4, 8)
    mm(a, b, backends=EXTERN)
    clear_dispatch_cache()
    assert dispatch_stats() == {"hits": 0, "misses": 0, "tunes": 0, "entries": 0, "selections": {},
                                "bucket_families": 0, "bucket_builds": 0, "outside_buckets": 0, "buckets_wanted": 0}
    mm(a, b, backends=EXTERN)
    assert len(tune_calls) == 2


def test_empty_problems_fall_back_to_torch(tune_calls):
    a, b = torch.randn(0, 4), torch.randn(4, 3)
    assert mm(a, b, backends=EXTERN).shape == (0, 3)
    bias = torch.randn(3)
    torch.testing.assert_close(addmm(bias, torch.randn(2, 0), torch.randn(0, 3), beta=2.0),
                               (2.0 * bias).expand(2, 3))
    assert tune_calls == []


# -- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    (torch.randn(3, 4), torch.randn(5, 2)),  # inner dims differ
    (torch.ones(3, 4, dtype=torch.int64), torch.ones(4, 2, dtype=torch.int64)),  # int dtype
    (torch.randn(3, 4), torch.randn(4, 2, dtype=torch.float64)),  # mixed dtypes
    (torch.randn(2, 3, 4), torch.randn(4, 2)),  # 3-D into mm
    ([[1.0, 2.0]], torch.randn(2, 2)),  # not a tensor
])
def test_bad_inputs_raise_input_error(args):
    with pytest.raises(InputError):
        mm(*args, backends=EXTERN)
    assert dispatch_stats()["entries"] == 0


def test_bad_input_after_a_good_one_still_raises():
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    mm(a, b, backends=EXTERN)
    with pytest.raises(InputError):
        mm(a, torch.randn(5, 2), backends=EXTERN)
    with pytest.raises(InputError):
        addmm(torch.randn(3), a, b, backends=EXTERN)  # bias (3,) does not broadcast to (3, 2)
    with pytest.raises(InputError):
        mm(a, b, out_layout="diagonal")
    with pytest.raises(BackendError):
        mm(a, b, backends=("cublas",))


# -- out_layout ------------------------------------------------------------------------------------

def test_col_out_layout_with_library_kernels():
    a, b = torch.randn(6, 4), torch.randn(4, 5)
    for _ in range(2):
        out = mm(a, b, backends=EXTERN, out_layout="col")
        assert out.shape == (6, 5) and out.stride() == (1, 6)
        torch.testing.assert_close(out, a @ b)
    row = mm(a, b, backends=EXTERN, out_layout="row")
    assert row.stride() == (5, 1)
    bias = torch.randn(5)
    out = addmm(bias, a, b, backends=EXTERN, out_layout="col")
    assert out.stride() == (1, 6)
    torch.testing.assert_close(out, torch.addmm(bias, a, b))


def test_col_out_layout_with_a_generated_template_is_a_layout_error():
    with pytest.raises(LayoutError):
        mm(torch.randn(6, 4), torch.randn(4, 5), backends=("numba",), out_layout="col")


# -- autograd --------------------------------------------------------------------------------------

def _f64(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


def test_gradcheck_library_kernels():
    a, b = _f64(4, 3), _f64(3, 5)
    assert torch.autograd.gradcheck(lambda x, y: mm(x, y, backends=EXTERN), (a, b))
    bias = _f64(5)
    assert torch.autograd.gradcheck(
        lambda z, x, y: addmm(z, x, y, beta=0.5, alpha=2.0, backends=EXTERN), (bias, a, b))
    x, y = _f64(2, 4, 3), _f64(2, 3, 5)
    assert torch.autograd.gradcheck(lambda p, q: bmm(p, q, backends=EXTERN), (x, y))
    # col output: the selection's kernel writes into a preallocated tensor, so grads go through the custom op
    assert torch.autograd.gradcheck(lambda x, y: mm(x, y, backends=EXTERN, out_layout="col"), (a, b))


def test_gradcheck_numba_winner():
    numba = ("numba",)
    a, b = _f64(4, 3), _f64(3, 5)
    assert torch.autograd.gradcheck(lambda x, y: mm(x, y, backends=numba), (a, b))
    bias = _f64(4, 1)
    assert torch.autograd.gradcheck(
        lambda z, x, y: addmm(z, x, y, beta=2.0, alpha=0.5, backends=numba), (bias, a, b))
    winners = {sel.winner.template_uid for sel in api.selections().values()}
    assert winners == {"numba_mm"}
    out = mm(a, b, backends=numba)
    assert out.grad_fn is not None and type(out.grad_fn).__name__ == "TunedMMBackward"


def test_no_grad_and_detached_calls_skip_autograd():
    a, b = _f64(4, 3), _f64(3, 5)
    with torch.no_grad():
        assert mm(a, b, backends=("numba",)).grad_fn is None
    assert mm(a.detach(), b.detach(), backends=("numba",)).grad_fn is None


def test_custom_ops_pass_opcheck():
    import gemmtune.dispatch.library  # noqa: F401  registers them (a compile's first trace does too)

    a, b, bias = torch.randn(4, 3), torch.randn(3, 5), torch.randn(5)
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    torch.library.opcheck(torch.ops.gemmtune.mm.default, (ag, bg, "extern", None))
    torch.library.opcheck(torch.ops.gemmtune.mm.default, (a, b, "extern", "col"))
    biasg = bias.clone().requires_grad_()
    torch.library.opcheck(torch.ops.gemmtune.addmm.default, (biasg, ag, bg, 0.5, 2.0, "extern", None))
    x, y = torch.randn(2, 4, 3, requires_grad=True), torch.randn(2, 3, 5, requires_grad=True)
    torch.library.opcheck(torch.ops.gemmtune.bmm.default, (x, y, "extern", None))


# -- torch.compile ---------------------------------------------------------------------------------

def _model(x, w, bias):
    h = torch.relu(mm(x, w, backends=EXTERN))
    return addmm(bias, h, w.t(), beta=0.5, alpha=2.0, backends=EXTERN).sin()


def _grads(fn, *tensors):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.sum().backward()
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_matches_eager(backend):
    torch._dynamo.reset()
    try:
        x, w, bias = torch.randn(8, 6), torch.randn(6, 6), torch.randn(6)
        compiled = torch.compile(_model, fullgraph=True, backend=backend)
        want, want_grads = _grads(_model, x, w, bias)
        got, got_grads = _grads(compiled, x, w, bias)
        torch.testing.assert_close(got, want)
        for g, e in zip(got_grads, want_grads):
            torch.testing.assert_close(g, e)
    finally:
        torch._dynamo.reset()


def test_compiled_graph_calls_the_gemmtune_ops_with_dynamic_shapes():
    # dynamic shapes cannot be tuned at trace time: the traced ops emit the opaque runtime ops
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    targets = []

    def spy(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    spy_backend = aot_autograd(fw_compiler=spy)

    def f(x, w, bias):
        return addmm(bias, mm(x, w, backends=["extern"]), w, out_layout="col", backends=EXTERN)

    try:
        compiled = torch.compile(f, fullgraph=True, backend=spy_backend, dynamic=True)
        w, bias = torch.randn(6, 6), torch.randn(6)
        for M in (8, 9, 17):
            x = torch.randn(M, 6)
            out = compiled(x, w, bias)
            assert out.stride() == (1, M)
            torch.testing.assert_close(out, f(x, w, bias))
        assert targets.count("gemmtune.mm.default") == 1 and targets.count("gemmtune.addmm.default") == 1
    finally:
        torch._dynamo.reset()


# -- patch -----------------------------------------------------------------------------------------

def _mlp():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 16, bias=False), nn.Tanh(), nn.Linear(16, 3))


@pytest.mark.parametrize("shape", [(5, 12), (2, 3, 12), (12,)])
def test_patch_mlp_matches_unpatched_outputs_and_gradients(shape):
    ref_model, model = _mlp(), _mlp()
    x = torch.randn(*shape)
    want, want_grads = _grads(lambda t: ref_model(t), x)
    assert patch(model, backends=EXTERN) is model
    assert patched_modules(model) == ["0", "2", "4"]
    got, got_grads = _grads(lambda t: model(t), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grads[0], want_grads[0])
    ref_model.zero_grad()
    model.zero_grad()
    ref_model(x).sum().backward()
    model(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert dispatch_stats()["tunes"] > 0
    assert unpatch(model) is model and patched_modules(model) == []
    tunes = dispatch_stats()["tunes"]
    torch.testing.assert_close(model(x), want)
    assert dispatch_stats()["tunes"] == tunes


def test_patch_with_numba_winners_matches():
    ref_model, model = _mlp(), patch(_mlp(), backends=("numba",))
    x = torch.randn(6, 12, requires_grad=True)
    torch.testing.assert_close(model(x), ref_model(x), rtol=1e-5, atol=1e-5)
    model(x).sum().backward()
    assert x.grad is not None and model[0].weight.grad is not None
    assert {sel.winner.template_uid for sel in api.selections().values()} == {"numba_mm"}


def test_patched_mlp_under_torch_compile_fullgraph():
    torch._dynamo.reset()
    try:
        ref_model, model = _mlp(), patch(_mlp(), backends=EXTERN)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        x = torch.randn(2, 5, 12)
        want, want_grads = _grads(ref_model, x)
        got, got_grads = _grads(compiled, x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_grads[0], want_grads[0])
    finally:
        torch._dynamo.reset()


def test_patch_leaves_linear_subclasses_with_their_own_forward_alone():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = patch(nn.Sequential(Scaled(4, 4), nn.Linear(4, 4)), backends=EXTERN)
    assert patched_modules(model) == ["1"]


def test_package_exports_the_api():
    names = ("mm", "addmm", "bmm", "patch", "unpatch", "clear_dispatch_cache")
    missing = [n for n in names if not hasattr(gemmtune, n)]
    if missing:
        pytest.skip(f"gemmtune/__init__.py does not export {missing} yet")
    assert gemmtune.mm is mm and gemmtune.patch is patch


def test_gradients_of_generated_winners_are_gemmtune_gemms():
    # backward runs through the eager API: the gradient problems are dispatched (and tuned) too
    gemmtune.clear_dispatch_cache()
    a, b = _f64(4, 3), _f64(3, 5)
    mm(a, b, backends=("numba",)).sum().backward()
    problems = {sel.problem.describe() for sel in api.selections().values()}
    assert problems == {"mm(4x3, 3x5)", "mm(4x5, 5x3)", "mm(3x4, 4x5)"}
