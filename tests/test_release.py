"""`gemmtune.warmup` releases, by default, the layers whose every problem runs torch's op
(`dispatch.release`): they compute what `nn.Linear` computes, through its parameter dict."""

from __future__ import annotations

import copy
import io

import torch
from torch import nn
from torch.nn.utils import parametrize

import gemmtune
from gemmtune.dispatch import patching
from gemmtune.dispatch.patch_report import ROUTE
from gemmtune.dispatch.release import lean_forward


def _mlp() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 6, bias=False))


def _released(aten_library) -> tuple[nn.Sequential, torch.Tensor]:
    model, x = _mlp(), torch.randn(5, 12)
    report = gemmtune.warmup(model, x, backends=("extern",), progress=False, in_model=False)
    assert report.released == ("0", "2")
    return model, x


def test_an_eager_warmup_releases_the_layers_torch_won_and_keeps_their_output(aten_library):
    model, x = _mlp(), torch.randn(5, 12)
    with torch.no_grad():
        ref = model(x)
    report = gemmtune.warmup(model, x, backends=("extern",), progress=False, in_model=False)
    assert report.released == ("0", "2") and patching.patched_modules(model) == []
    assert all(vars(m)["forward"].__func__ is lean_forward for m in (model[0], model[2]))
    tunes = gemmtune.dispatch_stats()["tunes"]
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref, rtol=0, atol=0)
        model(torch.randn(7, 12))  # a new shape at a released layer runs torch's op: nothing is tuned
    assert gemmtune.dispatch_stats()["tunes"] == tunes
    assert "released 2 layers to torch's op" in report.table()


def test_release_false_and_for_compile_keep_every_layer_patched(aten_library):
    for kwargs in ({"release": False}, {"for_compile": True}):
        model, x = _mlp(), torch.randn(5, 12)
        report = gemmtune.warmup(model, x, backends=("extern",), progress=False, in_model=False, **kwargs)
        assert report.released == () and patching.patched_modules(model) == ["0", "2"], kwargs


def test_a_released_layer_trains_like_nn_linear(aten_library):
    model, x = _released(aten_library)
    twin = _mlp()
    model(x).square().sum().backward()
    twin(x).square().sum().backward()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_a_weight_kept_outside_the_parameter_dict_runs_nn_linear_forward(aten_library):
    """A parametrisation moves the weight out of `_parameters`: the lean forward falls back."""

    class Doubled(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    model, x = _released(aten_library)
    parametrize.register_parametrization(model[0], "weight", Doubled())
    with torch.no_grad():
        w = model[0].parametrizations.weight.original
        torch.testing.assert_close(model[0](x), torch.nn.functional.linear(x, 2 * w, model[0].bias))


def test_a_released_model_copies_pickles_and_unpatches(aten_library):
    model, x = _released(aten_library)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].weight.mul_(3)  # the copy's forward reads the copy's weight
        assert not torch.equal(twin(x), model(x))
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    gemmtune.unpatch(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert patching.patch_report(model).not_routed["0"].startswith("not patched")


def test_patch_routes_a_released_layer_again(aten_library):
    model, x = _released(aten_library)
    assert patching.patch_report(model).not_routed["0"].startswith("released by gemmtune.warmup")
    gemmtune.patch(model, backends=("extern",))
    assert patching.patched_modules(model) == ["0", "2"]
    tunes = gemmtune.dispatch_stats()["tunes"]
    with torch.no_grad():
        model(torch.randn(7, 12))
    assert gemmtune.dispatch_stats()["tunes"] == tunes + 2


def test_a_second_warm_up_tunes_the_new_shapes_of_released_layers_too(monkeypatch, aten_library):
    """`wide` keeps a numba pick (patched), `narrow` is released; warmed up again at a new batch size,
    both layers' new problems are tuned, and `narrow` keeps its backends."""
    from gemmtune import engine

    real = engine.tune
    monkeypatch.setattr(engine, "tune", lambda op, *t, backends=None, **kw: real(
        op, *t, backends=("numba",) if t[-2].shape[-1] == 12 else ("extern",), **kw))
    model = nn.Sequential(nn.Linear(12, 16, bias=False), nn.Linear(16, 6))
    first = gemmtune.warmup(model, torch.randn(5, 12), progress=False, in_model=False, backends=("extern",))
    assert first.released == ("1",) and patching.patched_modules(model) == ["0"]
    second = gemmtune.warmup(model, torch.randn(9, 12), progress=False, in_model=False)
    assert second.tuned == 2 and len(second.rows) == 2  # both layers' M = 9 problems, not only the patched one's
    assert second.released == ("1",) and vars(model[0])[ROUTE] == (("extern",), None)


def test_a_released_model_compiles_and_matches_eager(aten_library):
    """Dynamo traces the lean forward (an instance forward calling F.linear) like nn.Linear's."""
    model, x = _released(aten_library)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
        assert compiled(torch.randn(3, 12)).shape == (3, 6)  # another batch size: traced again, still right
