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


def test_patch_refuses_a_layout_a_linear_layer_cannot_return():
    with pytest.raises(InputError, match="out_layout must be None or 'padded'"):
        gemmtune.patch(_lm(), out_layout="col")


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
