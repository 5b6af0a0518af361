"""`patch` tells the truth: MHA's projections are not listed, and the encoder fast path is reported."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.dispatch.patching import patch_report, patched_modules


pytestmark = pytest.mark.usefixtures("memory_store")


def _calls() -> int:
    s = gemmtune.dispatch_stats()
    return s["hits"] + s["misses"]


def _layer() -> nn.TransformerEncoderLayer:
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)


def test_mha_projections_are_not_listed_as_patched():
    layer = gemmtune.patch(_layer(), backends=("extern",))
    assert patched_modules(layer) == ["linear1", "linear2"]
    assert "self_attn.out_proj" in patch_report(layer).not_routed


def test_train_mode_routes_exactly_the_feed_forward_linears():
    layer = _layer().train()
    x = torch.randn(2, 5, 16)
    ref = layer(x)
    gemmtune.patch(layer, backends=("extern",))
    got = layer(x)
    assert _calls() == 2  # linear1 and linear2; MHA's projections never reach gemmtune
    torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_eval_fast_path_makes_no_gemmtune_call_and_the_report_says_so(ctx, capsys):
    layer = _layer().eval()
    x = torch.randn(2, 5, 16)
    gemmtune.patch(layer, backends=("extern",), report=True)
    err = capsys.readouterr().err
    assert "linear1" in err and "fast path" in err and "self_attn.out_proj" in err
    with ctx():
        layer(x)
    assert _calls() == 0
    assert "" in patch_report(layer).fast_paths
