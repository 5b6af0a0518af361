"""`gemmtune.patch(model, out_layout="padded")` and `gemmtune.warmup(..., out_layout="padded")`: a layer
whose output rows are not whole 16 bytes (an LM head of an odd vocabulary) returns a view of padded rows
from its pick, on every call; every other layer stays row-major."""

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.core.errors import InputError
from gemmtune.dispatch import patching
from gemmtune.dispatch.eager import dispatch_stats
from gemmtune.dispatch.patch_report import RELEASED, ROUTE
from gemmtune.dispatch.release import release_library_layers

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")


def _lm(vocab: int = 1001, bias: bool = False) -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, vocab, bias=bias))


@pytest.mark.parametrize("bias", [False, True])
def test_a_patched_odd_head_returns_padded_rows_on_every_call_and_the_others_stay_row_major(bias):
    model, x = _lm(bias=bias), torch.randn(2, 5, 16)
    ref = model(x)
    gemmtune.patch(model, out_layout="padded", backends=("extern",))
    for _ in range(3):  # the tune, then the layer's fast path (a library pick must not fall back to F.linear)
        y = model(x)
        assert y.shape == (2, 5, 1001) and y.stride() == (5 * 1024, 1024, 1)
        torch.testing.assert_close(y, ref)
    assert model[0](torch.randn(2, 5, 16)).stride() == (160, 32, 1)  # 32 floats: whole rows already
    assert dispatch_stats()["tunes"] == 2


def test_without_the_layout_a_patched_head_stays_contiguous():
    model, x = gemmtune.patch(_lm(), backends=("extern",)), torch.randn(3, 16)
    for _ in range(2):
        assert model(x).is_contiguous()


def test_patch_refuses_a_layout_a_linear_layer_cannot_return_and_takes_row_as_none():
    with pytest.raises(InputError, match="out_layout must be None, 'row' or 'padded'"):
        gemmtune.patch(_lm(), out_layout="col")
    assert vars(gemmtune.patch(nn.Linear(4, 19), out_layout="row"))[ROUTE] == (None, None)


def test_two_layers_of_one_shape_keep_their_own_layouts_call_after_call():
    padded = gemmtune.patch(nn.Linear(8, 19), backends=("extern",), out_layout="padded")
    plain = gemmtune.patch(nn.Linear(8, 19), backends=("extern",))
    x = torch.randn(4, 8)
    for _ in range(3):
        assert padded(x).stride() == (20, 1) and plain(x).stride() == (19, 1)


@pytest.mark.parametrize("first, then, route", [
    ({"out_layout": "padded"}, {"backends": ("extern",)}, (("extern",), "padded")),
    ({"backends": ("extern",)}, {"out_layout": "padded"}, (("extern",), "padded")),
    ({"backends": ("extern",), "out_layout": "padded"}, {}, (("extern",), "padded"))])
def test_a_warm_up_keeps_what_a_patched_layer_was_given_where_it_is_not_given_again(first, then, route):
    model, x = gemmtune.patch(_lm(), **first), torch.randn(3, 16)
    gemmtune.warmup(model, x, progress=False, in_model=False, release=False, **then)
    assert vars(model[2])[ROUTE] == route and model(x).stride() == (1024, 1)


def test_torchs_op_in_place_of_a_padded_pick_writes_padded_rows_and_keeps_the_layer():
    # The in-model check's switch (set_library): torch's op for a padded layer is F.linear laid out as padded rows.
    head, x = gemmtune.patch(nn.Linear(8, 19), backends=("extern",), out_layout="padded"), torch.randn(4, 8)
    ref = head(x)
    selections = {id(sel): sel for sel, _ in patching._ORIGIN.values()}
    assert len(selections) == 1
    assert patching.set_library(next(iter(selections.values())), True) == 1
    y = head(x)
    assert y.stride() == (20, 1) and not patching.runs_library(head, x)
    torch.testing.assert_close(y, ref)
    assert release_library_layers(head, lambda: head(x)) == [] and head(x).stride() == (20, 1)


def test_a_layer_released_by_an_earlier_gemmtune_is_patched_again_with_its_backends():
    # A pickled model keeps what an earlier gemmtune set on a released layer: (backends,).
    released = nn.Linear(8, 19)
    vars(released)[RELEASED] = (("extern",),)
    patching.repatch_released(released)
    assert vars(released)[ROUTE] == (("extern",), None)


def test_repatch_keeps_a_released_layers_own_route():
    head = patching.release(gemmtune.patch(nn.Linear(8, 19), backends=("extern",), out_layout="padded"),
                            nn.Linear.forward)
    assert vars(patching.repatch(head, None, None))[ROUTE] == (("extern",), "padded")
    assert vars(patching.repatch(head, ("numba",), None))[ROUTE] == (("numba",), "padded")


def test_a_released_layer_is_patched_again_with_its_layout():
    head = gemmtune.patch(nn.Linear(8, 19), backends=("extern",), out_layout="padded")
    patching.release(head, nn.Linear.forward)
    assert vars(head)[RELEASED] == (("extern",), "padded") and ROUTE not in vars(head)
    patching.repatch_released(head)
    assert vars(head)[ROUTE] == (("extern",), "padded")
    assert head(torch.randn(4, 8)).stride() == (20, 1)


def test_a_warm_up_with_the_layout_keeps_the_head_patched_and_tunes_nothing_later():
    model, x = _lm(), torch.randn(6, 16)
    ref = model(x)
    report = gemmtune.warmup(model, x, backends=("extern",), out_layout="padded", progress=False, in_model=False)
    assert len(report.rows) == 2 and "2" not in report.released  # the head's pick writes padded rows
    assert [r.problem.endswith(" [padded]") for r in report.rows] == [False, True]
    tunes = dispatch_stats()["tunes"]
    with torch.no_grad():
        y = model(x)
    assert y.stride() == (1024, 1) and dispatch_stats()["tunes"] == tunes
    torch.testing.assert_close(y, ref)


def test_a_compiled_patched_head_keeps_its_padded_rows():
    model, x = gemmtune.patch(_lm(), out_layout="padded", backends=("extern",)), torch.randn(4, 16)
    with torch.no_grad():
        ref = model(x)
        y = torch.compile(model)(x)
    assert y.stride() == (1024, 1)
    torch.testing.assert_close(y, ref)
