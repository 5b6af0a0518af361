"""`out_layout="padded"`: rows padded to whole 16 bytes where N's are not (the view Inductor's padding
returns), written by the library's kernels; the row-major layout where N's rows are whole already."""

import pytest
import torch

import gemmtune
from gemmtune.core.errors import InputError, LayoutError
from gemmtune.core.layout import output_strides, padded_row
from gemmtune.dispatch import eager as api
from gemmtune.dispatch.eager import addmm, bmm, dispatch_stats, mm  # conftest clears the dispatch dict

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")


@pytest.mark.parametrize("dtype, n, row", [(torch.float32, 19, 20), (torch.bfloat16, 19, 24),
                                           (torch.float16, 70, 72), (torch.bfloat16, 50257, 50304)])
def test_a_padded_row_is_whole_16_bytes_and_128_where_that_adds_at_most_a_sixteenth(dtype, n, row):
    assert padded_row(n, dtype.itemsize) == row
    assert row * dtype.itemsize % 16 == 0 and padded_row(row, dtype.itemsize) == row
    assert output_strides((3, n), "padded", dtype.itemsize) == (row, 1)


def test_a_padded_layout_needs_the_element_size():
    with pytest.raises(ValueError, match="element size"):
        output_strides((3, 19), "padded")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mm_and_addmm_return_a_view_of_padded_rows_that_equals_torchs_product(dtype):
    a, w, bias = torch.randn(33, 16, dtype=dtype), torch.randn(19, 16, dtype=dtype), torch.randn(19, dtype=dtype)
    row = padded_row(19, dtype.itemsize)
    for _ in range(2):  # the tune, then the dispatch dict's runner
        y = mm(a, w.t(), out_layout="padded")
        assert y.shape == (33, 19) and y.stride() == (row, 1)
        torch.testing.assert_close(y, a @ w.t())
    assert dispatch_stats()["tunes"] == 1
    z = addmm(bias, a, w.t(), beta=0.5, alpha=2.0, out_layout="padded")
    assert z.stride() == (row, 1)
    torch.testing.assert_close(z, torch.addmm(bias, a, w.t(), beta=0.5, alpha=2.0))


def test_bmm_pads_each_matrix_rows_and_an_aligned_n_stays_row_major():
    p, q = torch.randn(2, 5, 16), torch.randn(2, 16, 7)
    y = bmm(p, q, out_layout="padded")
    assert y.stride() == (40, 8, 1)
    torch.testing.assert_close(y, torch.bmm(p, q))
    a, b = torch.randn(9, 16), torch.randn(16, 20)  # 20 floats: 80 bytes, whole already
    assert mm(a, b, out_layout="padded").stride() == (20, 1)


def test_only_the_library_competes_where_n_needs_padding_and_every_template_where_it_does_not():
    a = torch.randn(40, 24)
    settings = gemmtune.Settings(store="off")
    padded = gemmtune.tune("mm", a, torch.randn(24, 19), out_layout="padded", settings=settings, progress=False)
    assert padded.out_layout == "padded" and padded.winner.is_extern
    assert all(t.choice.is_extern for t in padded.timings)
    aligned = gemmtune.tune("mm", a, torch.randn(24, 20), out_layout="padded", settings=settings, progress=False)
    assert any(not t.choice.is_extern for t in aligned.timings)  # numba's kernels write row-major rows
    assert aligned(a, torch.randn(24, 20)).stride() == (20, 1)


def test_padded_picks_are_stored_apart_from_row_major_ones(tmp_path):
    settings = gemmtune.Settings(store=str(tmp_path / "s.sqlite"))
    a, b = torch.randn(16, 8), torch.randn(8, 19)
    first = gemmtune.tune("mm", a, b, out_layout="padded", backends=("extern",), settings=settings, progress=False)
    row = gemmtune.tune("mm", a, b, backends=("extern",), settings=settings, progress=False)
    again = gemmtune.tune("mm", a, b, out_layout="padded", backends=("extern",), settings=settings, progress=False)
    assert not first.cache_hit and not row.cache_hit and again.cache_hit
    assert again(a, b).stride() == (20, 1) and row(a, b).stride() == (19, 1)


def test_backends_without_a_library_kernel_cannot_write_padded_rows():
    with pytest.raises(LayoutError, match="padded.*numba"):
        mm(torch.randn(6, 8), torch.randn(8, 5), backends=("numba",), out_layout="padded")
    with pytest.raises(InputError, match="'padded'"):
        mm(torch.randn(6, 8), torch.randn(8, 5), out_layout="pad")


def test_an_empty_problem_and_a_gradient_keep_the_layout():
    y = mm(torch.randn(0, 8), torch.randn(8, 5), out_layout="padded")
    assert y.shape == (0, 5) and y.stride() == (8, 1)
    a = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)  # 5 doubles: 40 bytes, padded to 48
    assert mm(a, b, out_layout="padded").stride() == (6, 1)
    assert torch.autograd.gradcheck(lambda x, y: mm(x, y, out_layout="padded"), (a, b))


def test_a_compiled_call_runs_the_padded_pick_itself_and_returns_its_view():
    from torch._dynamo.backends.common import aot_autograd
    seen: list[str] = []

    def spy(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    f = torch.compile(lambda x, w: gemmtune.mm(x, w.t(), out_layout="padded"), backend=aot_autograd(fw_compiler=spy),
                      fullgraph=True)
    x, w = torch.randn(12, 16), torch.randn(19, 16)
    y = f(x, w)
    assert y.stride() == (20, 1)
    torch.testing.assert_close(y, x @ w.t())
    assert "gemmtune.mm.default" in seen and "aten.mm.default" not in seen  # not a traced row-major op and a copy


def test_a_dynamic_compile_keeps_its_promised_strides_at_every_n():
    # Inductor checks each output's strides against the fake's: an N of whole 16 bytes is row-major, else padded.
    f = torch.compile(lambda x, w: (gemmtune.mm(x, w, out_layout="padded") * 2).sum(0), dynamic=True)
    x = torch.randn(3, 8)
    for n in (1000, 1004, 1001, 999):
        w = torch.randn(8, n)
        torch.testing.assert_close(f(x, w), (x @ w * 2).sum(0))


def test_an_aligned_padded_layout_shares_the_row_major_pick_and_a_2d_bias_is_added():
    settings = gemmtune.Settings(store="memory")
    a, b = torch.randn(16, 8), torch.randn(8, 20)
    gemmtune.tune("mm", a, b, out_layout="padded", backends=("extern",), settings=settings, progress=False)
    assert gemmtune.tune("mm", a, b, backends=("extern",), settings=settings, progress=False).cache_hit
    bias = torch.randn(16, 19)
    z = addmm(bias, a, torch.randn(8, 19), out_layout="padded")
    assert z.stride() == (20, 1)


def test_a_library_kernels_padded_twin_competes_and_writes_padded_rows():
    from gemmtune.core.binding import layout_kernel
    from gemmtune.core.inputs import KernelInputs
    from gemmtune.core.layout import empty_output
    from gemmtune.measure.runners import local_runner
    from gemmtune.templates.cpu_numba import NumbaMMTemplate
    from gemmtune.templates.extern import AtenTemplate
    from gemmtune.templates.padded import PaddedTemplate

    twin = PaddedTemplate(AtenTemplate("mm"))
    assert twin.writes_padded_rows and not PaddedTemplate(NumbaMMTemplate()).writes_padded_rows
    a, b = torch.randn(9, 18), torch.randn(18, 19)  # K and N both padded by the twin
    ki = KernelInputs.from_tensors("mm", a, b)
    out = empty_output(ki.out_size, ki.dtype, "cpu", "padded")
    launch = twin.compile(twin.configs(ki)[0], ki, (a, b))
    launch((a, b), out)  # a given output: the block is copied into it
    assert out.stride() == (20, 1)
    torch.testing.assert_close(out, a @ b)
    own = layout_kernel(ki, {}, launch, "padded")(a, b)  # none given: the twin's own padded output, not a copy
    assert own.stride() == (20, 1) and own.untyped_storage().nbytes() == 9 * 20 * 4 > out.untyped_storage().nbytes()
    assert own._base is None  # not a view: an autograd function's output may be changed in place
    torch.testing.assert_close(own, a @ b)
    runner = local_runner(ki, (a, b), lambda c: launch, gemmtune.Settings(), "padded")
    choice = twin.configs(ki)[0]
    assert runner.check(choice) is None and runner._fn(choice)().untyped_storage().nbytes() == 9 * 20 * 4  # timed so
    sel = gemmtune.tune("mm", a, b, out_layout="padded", templates=[AtenTemplate("mm"), twin, NumbaMMTemplate()],
                        backends=("extern", "numba"),  # named: the twin runs on CPU too
                        settings=gemmtune.Settings(store="off"), progress=False)
    assert {t.choice.template_uid for t in sel.timings} == {"aten_mm", "padded_aten_mm"}
    assert sel(a, b).stride() == (20, 1)
    torch.testing.assert_close(sel(a, b), a @ b)


@pytest.mark.parametrize("n, for_compile", [(20, False), (19, False), (19, True)])
def test_a_warm_up_readies_the_padded_calls_it_records(n, for_compile):
    from torch import nn

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, n))

        def forward(self, x):
            return gemmtune.mm(x, self.w, out_layout="padded")

    head, x = Head(), torch.randn(4, 8)
    with torch.no_grad():
        gemmtune.warmup(head, x, progress=False, for_compile=for_compile, in_model=False)
        assert api.dispatched("mm", (x, head.w), out_layout="padded") is not None  # the call's own key
        tunes = dispatch_stats()["tunes"]
        assert head(x).stride() == (padded_row(n, 4), 1) and dispatch_stats()["tunes"] == tunes
