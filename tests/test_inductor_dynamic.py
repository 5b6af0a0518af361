"""Compiled GEMMs with a symbolic M (`gemmtune.inductor.dynamic`): a pick per M bucket, chosen at run time.

Real compiles on CPU: `torch.compile(dynamic=True)` and `mark_dynamic` graphs, with the library kernel and
(with `templates="all"`) numba kernels as the picks; every output is checked against eager.  The GPU
case (Triton picks, the host time per call) runs in tests/gpu/test_dynamic_gpu.py.
"""

from __future__ import annotations

import json
import types

import pytest
import torch

import gemmtune
import gemmtune.inductor as gi
from gemmtune.core.binding import bound_to
from gemmtune.core.errors import InputError
from gemmtune.core.choices import Choice
from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.core.m_range import bucket_of
from gemmtune.inductor import dynamic
from helpers import fresh_inductor  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table")

OFF = gemmtune.Settings(store="off")


@pytest.fixture(autouse=True)
def _fresh(fresh_inductor):
    dynamic.reset()
    yield
    dynamic.reset()


def _linear(n: int = 24, k: int = 40, bias: bool = False) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(k, n, bias=bias)


def _code(fn, *args) -> str:
    from torch._inductor.utils import run_and_get_code

    return "\n".join(run_and_get_code(fn, *args)[1])


def test_the_table_round_trips_and_the_nearest_bucket_serves_an_m_outside_it():
    text = dynamic.table_text("addmm", 1.0, 0.5, {4: "aten_addmm", 1: "k1", 64: "k64"}, "addmm A(M, 8) ...")
    assert json.loads(text)["family"] == "addmm A(M, 8) ..."
    assert dynamic.parse_table(text) == ("addmm", 1.0, 0.5, {1: "k1", 4: "aten_addmm", 64: "k64"})
    picks = {1: "a", 4: "b", 64: "c"}
    assert [dynamic.nearest(picks, m) for m in (1, 3, 4, 5, 20, 33, 64, 5000)] == [1, 4, 4, 4, 64, 64, 64, 64]
    assert dynamic.nearest({2: "a", 8: "b"}, 4) == 8  # a tie: the larger bucket


@pytest.mark.parametrize("text, names", [
    ("not json", "not JSON"), ("[1, 2]", "keys"), ('{"op": "mm"}', "keys"),
    ('{"op": "bmm", "alpha": 1, "beta": 0, "family": "", "buckets": {"1": "k"}}', "op must be"),
    ('{"op": "mm", "alpha": NaN, "beta": 0, "family": "", "buckets": {"1": "k"}}', "finite"),
    ('{"op": "mm", "alpha": "1", "beta": 0, "family": "", "buckets": {"1": "k"}}', "finite"),
    ('{"op": "mm", "alpha": 1, "beta": 0, "family": "", "buckets": {"1": "k"}}', "alpha = beta = 1"),
    ('{"op": "addmm", "alpha": 1' + "0" * 400 + ', "beta": 0, "family": "", "buckets": {"1": "k"}}', "finite"),
    ('{"op": "addmm", "alpha": 1, "beta": 0, "family": "", "buckets": {"\u00b2": "k"}}', "power of two"),
    ('{"op": "addmm", "alpha": 1, "beta": 0, "family": "", "buckets": {}}', "buckets"),
    ('{"op": "mm", "alpha": 1, "beta": 1, "family": "", "buckets": {"6": "k"}}', "power of two"),
    ('{"op": "mm", "alpha": 1, "beta": 1, "family": "", "buckets": {"-1": "k"}}', "power of two"),
    ('{"op": "mm", "alpha": 1, "beta": 1, "family": "", "buckets": {"1": 7}}', "choice key"),
    ('{"op": "mm", "alpha": 1, "beta": 1, "family": "", "buckets": {"1": "' + "k" * 2000 + '"}}', "choice key"),
    ("x" * (dynamic.MAX_TABLE_BYTES + 1), "at most"),
])
def test_a_bad_entry_is_refused_with_an_error_naming_it(text, names):
    with pytest.raises(ValueError, match="bucketed GEMM entry.*" + names):
        dynamic.parse_table(text)


def test_the_buckets_are_tuned_coarsely_then_bisected_where_neighbours_disagree():
    asked = []
    picks = dynamic.refined([1 << i for i in range(13)], lambda b: asked.append(b) or "same")
    assert asked == [1, 16, 256, 4096] and picks == {1: "same", 16: "same", 256: "same", 4096: "same"}
    asked.clear()
    picks = dynamic.refined([1 << i for i in range(13)], lambda b: asked.append(b) or ("a" if b <= 8 else "b"))
    assert sorted(asked) == [1, 4, 8, 16, 256, 4096] and picks[8] == "a" and picks[16] == "b"
    assert dynamic.refined([32], lambda b: "x") == {32: "x"}


def test_a_dynamic_compile_runs_each_m_on_its_buckets_pick():
    layer = _linear()
    handler = gi.install(settings=OFF, m="1:64")
    f = torch.compile(layer, dynamic=True)
    with torch.no_grad():
        for m in (8, 3, 33, 64, 100, 8):
            x = torch.randn(m, 40)
            torch.testing.assert_close(f(x), layer(x), rtol=1e-4, atol=1e-4)
    assert handler.stats["bucketed"] == 1 and len(handler.tables) == 1
    _, _, _, picks = dynamic.parse_table(next(iter(handler.tables.values())))
    assert sorted(picks) == [1, 16, 64] and set(picks.values()) == {"aten_mm"}  # one pick: nothing bisected
    # M = 64 ran the kernel its bucket's tune compiled; 8, 3, 33 and 100 built their bucket's pick once
    assert dynamic.STATS["builds"] == 4 and dynamic.STATS["outside"] == 1


def test_the_kernels_kept_for_calls_sizes_are_bounded(monkeypatch):
    monkeypatch.setattr(dynamic, "MAX_KERNELS", 2)
    layer = _linear()
    gi.install(settings=OFF, m="1:16")
    f = torch.compile(layer, dynamic=True)
    with torch.no_grad():
        for m in (3, 5, 6, 7, 3):
            x = torch.randn(m, 40)
            torch.testing.assert_close(f(x), layer(x), rtol=1e-4, atol=1e-4)
    assert len(dynamic._KERNELS) == 2 and dynamic.STATS["builds"] == 5  # M = 3 was dropped, then built again


def test_mark_dynamic_bounds_choose_the_buckets_and_the_code_calls_the_bucketed_kernel():
    layer = _linear(bias=True)
    gi.install(settings=OFF)
    f = torch.compile(layer)
    x = torch.randn(20, 40)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=48)
    with torch.no_grad():
        code = _code(f, x)
        for m in (2, 17, 48):
            y = torch.randn(m, 40)
            torch.testing.assert_close(f(y), layer(y), rtol=1e-4, atol=1e-4)
    assert "extern_kernels.gemmtune_buckets" in code
    handler = gi.installer._ACTIVE[-1]
    (text,) = handler.tables.values()
    op, alpha, beta, picks = dynamic.parse_table(text)
    assert op == "addmm" and sorted(picks) == [2, 32, 64]  # buckets 2 to 64, the coarse ones (one pick)


def test_batch_times_tokens_is_one_m_bucketed_by_its_product():
    layer = _linear(bias=True)
    handler = gi.install(settings=OFF, m="1:64")
    f = torch.compile(layer)
    x = torch.randn(2, 5, 40)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(x, 1)
    with torch.no_grad():
        for shape in ((2, 5), (3, 7), (4, 16), (2, 9)):
            y = torch.randn(*shape, 40)
            torch.testing.assert_close(f(y), layer(y), rtol=1e-4, atol=1e-4)
    assert handler.stats["bucketed"] == 1, handler.stats  # M = batch x tokens, a product of two symbols


def test_generated_picks_are_built_for_a_new_m_from_their_bucket():
    pytest.importorskip("numba")
    layer = _linear(n=40, k=64)
    handler = gi.install(settings=OFF.with_(backends=("numba",)), templates="all", m=[16, 64])
    f = torch.compile(layer, dynamic=True)
    with torch.no_grad():
        for m in (16, 40, 50):
            x = torch.randn(m, 64)
            torch.testing.assert_close(f(x), layer(x), rtol=1e-4, atol=1e-4)
    _, _, _, picks = dynamic.parse_table(next(iter(handler.tables.values())))
    assert all(key.startswith("numba") for key in picks.values()), picks
    assert dynamic.STATS["builds"] == 2  # M = 40 and 50: bucket 64's numba kernel, built for their sizes


def test_m_false_tunes_the_traced_size_alone_and_a_symbolic_n_is_not_bucketed():
    layer = _linear()
    handler = gi.install(settings=OFF, m=False)
    with torch.no_grad():
        torch.compile(layer, dynamic=True)(torch.randn(8, 40))
    assert handler.stats["bucketed"] == 0 and handler.stats["tuned"] == 1
    gi.uninstall()
    torch._dynamo.reset()
    handler = gi.install(settings=OFF)
    a, b = torch.randn(8, 40), torch.randn(40, 24)
    with torch.no_grad():
        torch.compile(lambda x, y: x @ y, dynamic=True)(a, b)  # M, K and N all symbolic
    assert handler.stats["bucketed"] == 0 and handler.stats["tuned"] == 1


def test_a_bad_range_is_refused_at_install_and_a_tampered_entry_at_the_call():
    with pytest.raises(InputError, match=r"install\(m=...\)"):
        gi.install(m="0:64")
    with pytest.raises(InputError, match=r"install\(m=...\)"):
        gi.install(m="many")
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    bad = json.dumps({"op": "mm", "alpha": 1.0, "beta": 1.0, "family": "", "buckets": {"3": "aten_mm"}})
    with pytest.raises(ValueError, match="power of two"):
        dynamic.run_buckets(a, b, table=bad, out=torch.empty(4, 2))


def test_the_range_keys_inductors_graph_cache_and_installed_passes_it():
    with gi.installed(m="1:64") as h64:
        u64 = h64.uuid()
        assert h64.m == "1:64"
    with gi.installed(m=False) as off:
        assert off.uuid() != u64 and off.m is False


def test_the_settings_key_inductors_graph_cache(monkeypatch):
    """A graph compiled while tunes ran under other settings (backends, a store) is not served from the cache."""
    def key(settings=None):
        with gi.installed(settings=settings) as handler:
            return handler.uuid()

    base = key(OFF)
    assert key(OFF) == base and key(OFF.with_(backends=("extern",))) != base and key(OFF.with_(store="memory")) != base
    monkeypatch.delenv("GEMMTUNE_BACKENDS", raising=False)
    from_env = key()
    monkeypatch.setenv("GEMMTUNE_BACKENDS", "extern")
    assert key() != from_env  # no settings given: the environment's
    monkeypatch.setenv("GEMMTUNE_TOP_X", "abc")  # a bad variable fails the tunes, not the graph cache's key
    assert isinstance(key(), str) and key() != from_env


def test_a_gemm_whose_n_is_m_too_is_not_bucketed_and_never_meets_another_gemms_kernel():
    pytest.importorskip("numba")
    handler = gi.install(settings=OFF.with_(backends=("numba",)), templates="all", m=[16, 64])
    w = torch.randn(8, 64)
    gram, proj = torch.compile(lambda x: x @ x.t()), torch.compile(lambda x, v: x @ v.t())
    with torch.no_grad():
        for f, args in ((gram, ()), (proj, (w,))):
            x = torch.randn(8, 64)
            torch._dynamo.mark_dynamic(x, 0)
            f(x, *args)
        assert len(handler.tables) == 1  # x @ x.t() has N = M: tuned at the traced size, not bucketed
        y = torch.randn(40, 64)
        torch.testing.assert_close(gram(y), y @ y.t(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(proj(y, w), y @ w.t(), rtol=1e-4, atol=1e-4)


def test_an_addmm_under_max_autotune_is_bucketed_once_and_tuned_nowhere_else():
    from torch._inductor import config

    layer = _linear(bias=True)
    handler = gi.install(settings=OFF, m="1:64")
    with config.patch(max_autotune=True), torch.no_grad():
        f = torch.compile(layer, dynamic=True)
        for m in (8, 30):
            x = torch.randn(m, 40)
            torch.testing.assert_close(f(x), layer(x), rtol=1e-4, atol=1e-4)
    assert handler.stats["bucketed"] == 1 and handler.stats["tuned"] == 0, handler.stats


def test_a_call_with_no_rows_writes_nothing_and_a_build_is_never_shared_with_other_ranks(monkeypatch):
    text = dynamic.table_text("mm", 1.0, 1.0, {1: "aten_mm"}, "mm A(M, 8)")
    out = torch.empty(0, 2)
    assert dynamic.run_buckets(torch.empty(0, 8), torch.randn(8, 2), table=text, out=out) is out
    seen = []
    import gemmtune.engine as engine

    real = engine.tune
    monkeypatch.setattr(engine, "tune", lambda *a, **k: seen.append(k["settings"]) or real(*a, **k))
    a, b = torch.randn(5, 8), torch.randn(8, 2)
    torch.testing.assert_close(dynamic.run_buckets(a, b, table=text, out=torch.empty(5, 2)), a @ b)
    assert [(s.store, s.distributed) for s in seen] == [("off", "off")]


def test_a_kernel_whose_launcher_binds_is_bound_once_and_writes_into_inductors_buffer():
    calls = []

    def kernel(*tensors, out=None):
        calls.append("general")
        return torch.mm(*tensors, out=out)

    def bind(*tensors):
        calls.append("bind")
        return lambda *operands, out=None: calls.append("bound") or torch.mm(*operands, out=out)

    kernel.bound = bind
    a, b, out = torch.randn(3, 4), torch.randn(4, 5), torch.empty(3, 5)
    text = dynamic.table_text("mm", 1, 1, {4: "triton_mm"}, "A(M, 4) (4, 1) float32; B(4, 5) (5, 1) float32")
    dynamic.register(text, [TensorMeta.of(a), TensorMeta.of(b)], bound_to(kernel, (a, b)))
    for _ in range(2):
        assert dynamic.run_buckets(a, b, table=text, out=out) is out
    assert torch.allclose(out, a @ b) and calls == ["bind", "bound", "bound"]
    unbound = lambda *t, out=None: torch.mm(*t, out=out)  # noqa: E731
    unbound.bound = lambda *t: None  # a launcher that declines: the kernel as it is
    assert bound_to(unbound, (a, b)) is unbound


def test_a_library_pick_of_an_mm_runs_torch_mm_itself():
    """torch.mm(a, b, out=out) is what aten_mm's launcher runs: the graph's call skips the launcher's frames."""
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    sel = gemmtune.tune("mm", a, b, backends=("extern",), settings=OFF, progress=False)
    assert sel.winner.template_uid == "aten_mm" and bound_to(sel.kernel, (a, b)) is torch.mm
    bias, out = torch.randn(5), torch.empty(3, 5)
    sel = gemmtune.tune("addmm", bias, a, b, alpha=0.5, beta=2.0, backends=("extern",), settings=OFF, progress=False)
    bound = bound_to(sel.kernel, (bias, a, b))  # torch.addmm on the bias expanded as its launcher expands it
    assert bound is not sel.kernel and bound(bias, a, b, out=out) is out
    torch.testing.assert_close(out, torch.addmm(bias, a, b, alpha=0.5, beta=2.0))


def test_an_mm_whose_pick_is_torch_mm_is_found_by_entry_and_m_in_any_layout_until_its_bucket_is_tuned():
    """A call of an mm whose bucket picked torch.mm is served by (entry, M) alone: torch's op takes any
    layout of A and of the output.  A bucket tuned later (`tune_wanted`) drops the kernels of its M."""
    layer = _linear()
    handler = gi.install(settings=OFF, m="1:8")
    f = torch.compile(layer, dynamic=True)
    with torch.no_grad():
        for m in (3, 40):  # 40: outside the range, bucket 8's pick, bucket 64 marked
            x = torch.randn(m, 40)
            torch.testing.assert_close(f(x), layer(x), rtol=1e-4, atol=1e-4)
    (text,) = handler.tables.values()
    assert dynamic._BY_M == {(text, m): torch.mm for m in (1, 8, 3, 40)}  # the tuned buckets' and the calls' M
    a, w = torch.randn(40, 3).t(), layer.weight.detach()
    out = torch.empty(24, 3).t()  # column-major A and output: not the layouts the kernel was built for
    kept, builds = len(dynamic._KERNELS), dynamic.STATS["builds"]
    assert dynamic.run_buckets(a, w.t(), table=text, out=out) is out
    torch.testing.assert_close(out, a @ w.t())
    assert (len(dynamic._KERNELS), dynamic.STATS["builds"]) == (kept, builds)  # served by (entry, M): nothing built
    assert gi.tune_wanted() == {64: 1}
    assert list(dynamic._BY_M) == [(text, 1), (text, 8), (text, 3)]
    assert all(bucket_of(k[1][0]) != 64 for k in dynamic._KERNELS)


def test_an_addmm_whose_pick_is_torchs_op_serves_every_bias_form_and_layout_by_entry_and_m():
    layer = _linear(bias=True).requires_grad_(False)
    handler = gi.install(settings=OFF, m="1:8")
    f = torch.compile(layer, dynamic=True)
    with torch.no_grad():
        torch.testing.assert_close(f(x := torch.randn(5, 40)), layer(x), rtol=1e-4, atol=1e-4)
    (text,) = handler.tables.values()
    assert getattr(dynamic._BY_M[text, 5], "any_layout", False)  # aten's addmm, bound to M = 5
    a, w = torch.randn(40, 5).t(), layer.weight
    kept, builds = len(dynamic._KERNELS), dynamic.STATS["builds"]
    for bias in (layer.bias, layer.bias[None], layer.bias.expand(5, 24)):  # as a vector, a row, the output's size
        out = torch.empty(24, 5).t()
        assert dynamic.run_buckets(bias, a, w.t(), table=text, out=out) is out
        torch.testing.assert_close(out, torch.addmm(layer.bias, a, w.t()))
    assert (len(dynamic._KERNELS), dynamic.STATS["builds"]) == (kept, builds)


def test_torchs_op_standing_in_for_a_pick_the_call_does_not_offer_is_never_served_by_entry_and_m():
    """A call whose layout does not offer its bucket's pick runs torch's op in its place; that kernel is kept
    for that call's layout alone, so another layout at the same M still builds the pick."""
    text = dynamic.table_text("mm", 1, 1, {8: "triton_mm_bk32_bm32_bn32[swizzle=1]"}, "A(M, 8) (8, 1) float32")
    a, b = torch.randn(5, 8), torch.randn(8, 4)
    assert dynamic.run_buckets(a, b, table=text, out=(out := torch.empty(5, 4))) is out  # no Triton on this pool
    torch.testing.assert_close(out, a @ b)
    assert len(dynamic._KERNELS) == 1 and dynamic._BY_M == {}
    dynamic.run_buckets(a.t().contiguous().t(), b, table=text, out=out)
    assert len(dynamic._KERNELS) == 2 and dynamic.STATS["builds"] == 2


def test_two_gemms_whose_a_differs_only_in_its_stride_keep_entries_and_kernels_apart():
    w = torch.randn(24, 40)
    handler = gi.install(settings=OFF, m="1:64")
    f = torch.compile(lambda x, y: (x @ w.t(), y[:, :40] @ w.t()))  # A's rows 40 and 56 apart
    with torch.no_grad():
        for m in (8, 5):
            x, y = torch.randn(m, 40), torch.randn(m, 56)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(y, 0)
            got = f(x, y)
            torch.testing.assert_close(got[0], x @ w.t(), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got[1], y[:, :40] @ w.t(), rtol=1e-4, atol=1e-4)
    families = sorted(json.loads(t)["family"] for t in handler.tables.values())
    assert families == ["A(M, 40) (40, 1) float32; B(40, 24) (1, 40) float32; on cpu",
                        "A(M, 40) (56, 1) float32; B(40, 24) (1, 40) float32; on cpu"]
    assert {key[0] for key in dynamic._KERNELS} == set(handler.tables.values())  # each kernel under its own entry


def test_a_buffer_laid_out_after_lowering_gets_a_kernel_bound_to_the_strides_it_comes_with(monkeypatch):
    """A is an Inductor buffer Inductor lays out column-major after the handler read it as row-major: a
    kernel bound to the row-major stand-ins (a Triton launcher fixes the strides it was bound with)
    must never serve it."""
    misread = []

    def bound_like_triton(kernel, tensors):
        fixed = [t.stride() for t in tensors]

        def bound(*operands, out=None):
            misread.extend(t.stride() for t, s in zip(operands, fixed) if t.stride() != s)
            return kernel(*[torch.as_strided(t, t.shape, s) for t, s in zip(operands, fixed)], out=out)
        return bound

    monkeypatch.setattr(dynamic, "bound_to", bound_like_triton)
    gi.install(settings=OFF, m="1:64")
    w = torch.randn(24, 40)
    f = torch.compile(lambda x: (torch.relu(x) * 2) @ w.t())
    with torch.no_grad():
        for m in (8, 16):
            x = torch.randn(40, m).t()  # column-major, M dynamic
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(f(x), (torch.relu(x) * 2) @ w.t(), rtol=1e-4, atol=1e-4)
    assert misread == []


def test_two_devices_never_share_an_entry():
    import sympy

    class Inputs:  # what the handler reads of Inductor's kernel inputs
        def __init__(self, device):
            self.device = lambda: torch.device(device)
            self.shapes_symbolic = lambda: [(sympy.Symbol("s0"), 40), (40, 24)]
            self.strides_symbolic = lambda: [(40, 1), (1, 40)]
            self.dtypes = lambda: [torch.bfloat16] * 2
            self.scalars = lambda: {}

    zero, one = Inputs("cuda:0"), Inputs("cuda:1")
    assert dynamic.table_key(zero, "mm") != dynamic.table_key(one, "mm")
    texts = {dynamic.family_text(i.shapes_symbolic(), i.strides_symbolic(), i.dtypes(), sympy.Symbol("s0"), i.device())
             for i in (zero, one)}
    assert texts == {"A(M, 40) (40, 1) bfloat16; B(40, 24) (1, 40) bfloat16; on cuda:0",
                     "A(M, 40) (40, 1) bfloat16; B(40, 24) (1, 40) bfloat16; on cuda:1"}


def test_an_m_outside_the_range_marks_its_bucket_and_tune_wanted_gives_it_its_own_pick():
    layer = _linear(bias=True)
    handler = gi.install(settings=OFF, m="1:8")
    f = torch.compile(layer, dynamic=True)

    def run(*ms):
        with torch.no_grad():
            for m in ms:
                x = torch.randn(m, 40)
                torch.testing.assert_close(f(x), layer(x), rtol=1e-4, atol=1e-4)

    run(3, 40, 50)  # 40 and 50 lie in bucket 64, outside 1..8: bucket 8's pick, bucket 64 marked
    (text,) = handler.tables.values()
    assert dynamic.STATS["outside"] == 2 and dynamic.STATS["wanted"] == 1 and list(dynamic.WANTED[text]) == [64]
    assert gi.tune_wanted() == {64: 1}
    assert list(dynamic.LATER[text]) == [64] and not dynamic.WANTED[text]
    builds = dynamic.STATS["builds"]
    run(40, 60)  # bucket 64's own pick, built again for 40; neither is outside now
    assert dynamic.STATS["builds"] == builds + 2 and dynamic.STATS["outside"] == 2
    assert gi.tune_wanted() == {}


def test_an_entrys_family_gives_the_operands_at_a_bucket_and_must_describe_the_call():
    from gemmtune.core.inputs import TensorMeta
    from gemmtune.inductor.outside import at_bucket

    meta = lambda size, stride: TensorMeta(size, stride, torch.float32, "cpu")  # noqa: E731
    family = "A(M, 40) (1, M) float32; B(40, 24) (1, 40) float32; on cpu"  # a column-major A
    call = [meta((3, 24), (0, 1)), meta((3, 40), (1, 3)), meta((40, 24), (1, 40))]  # a bias broadcast over rows
    bias, a, b = at_bucket(family, call, 16)
    assert (a.size, a.stride, b.size, b.stride) == ((16, 40), (1, 16), (40, 24), (1, 40))
    assert (bias.size, bias.stride) == ((16, 24), (0, 1))
    assert at_bucket(family, [meta((24,), (1,)), *call[1:]], 16)[0] == meta((24,), (1,))
    for bad in ("nonsense; on cpu", family.replace("; on cpu", ""), family.replace("float32", "nn", 1),
                family.replace("(M, 40)", "(M, x)"), family.replace("(M, 40)", "(M, 41)"),
                family.replace("B(40, 24)", "A(40, 24)"), family.replace("(M, 40)", "(M, 99999999999)")):
        with pytest.raises(ValueError, match="gemmtune bucketed GEMM entry"):
            at_bucket(bad, call, 16)


def test_an_entry_that_cannot_be_tuned_later_is_named_once_and_the_others_are_tuned(caplog):
    call = (torch.randn(40, 8), torch.randn(4, 8).t())
    good = dynamic.table_text("mm", 1.0, 1.0, {1: "aten_mm", 8: "aten_mm"},
                              "A(M, 8) (8, 1) float32; B(8, 4) (1, 8) float32; on cpu")
    stale = dynamic.table_text("mm", 1.0, 1.0, {1: "aten_mm", 8: "aten_mm"},
                               "A(M, 8) (8, 1) float32; B(8, 4) (1, 8) float32")  # no device: an older entry
    for text in (stale, good):
        out = torch.empty(40, 4)
        dynamic.run_buckets(*call, table=text, out=out)
        torch.testing.assert_close(out, call[0] @ call[1])
    assert dynamic.STATS["wanted"] == 2
    with caplog.at_level("WARNING", logger="gemmtune"):
        assert gi.tune_wanted() == {64: 1}
    assert "bucket 64 of a bucketed GEMM not tuned" in caplog.text
    assert list(dynamic.LATER) == [good] and not any(dynamic.WANTED.values())
    assert gi.tune_wanted() == {}  # the stale entry is not tried again


def test_two_threads_tune_a_marked_bucket_once(monkeypatch):
    import threading

    from gemmtune.inductor import outside

    call = (torch.randn(40, 8), torch.randn(4, 8).t())
    text = dynamic.table_text("mm", 1.0, 1.0, {1: "aten_mm", 8: "aten_mm"},
                              "A(M, 8) (8, 1) float32; B(8, 4) (1, 8) float32; on cpu")
    dynamic.run_buckets(*call, table=text, out=torch.empty(40, 4))
    tuned, real = [], outside._tune_bucket
    monkeypatch.setattr(outside, "_tune_bucket", lambda *a: tuned.append(a[1]) or real(*a))
    threads = [threading.Thread(target=gi.tune_wanted) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tuned == [64] and dynamic.LATER[text] == {64: "aten_mm"}
