"""`gemmtune.tune`, `gemmtune.patch` and `gemmtune.warmup` given options of the wrong kind: a typed error
naming the option, raised before any tune, patch or forward; a patched layer given a non-tensor raises as
an unpatched `nn.Linear` does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.core.errors import BackendError, InputError
from gemmtune.dispatch.patching import patched_modules
from gemmtune.templates.extern import AtenTemplate


@pytest.mark.parametrize("option, value, says", [
    ("store", "off", r"store: expected an open store .*got str; a path, a redis:// URL or 'off' goes in settings="),
    ("store", 0, "store: expected an open store"),
    ("settings", "off", "settings: expected a gemmtune.Settings or None, got str"),
    ("templates", "aten_mm", "templates: expected None or a tuple or list of templates .*; got str"),
    ("templates", [AtenTemplate("mm"), 3], "templates: .*; item 1 is int"),
    ("finalize", 3, "finalize: expected a tuple or list of callables; got int"),
    ("listener", "stderr", "listener: expected a callable or None, got str"),
    ("store_tag", 3, "store_tag: expected a string or None, got int"),
    ("progress", "yes", "progress: expected True, False or None, got 'yes'")])
def test_a_tune_option_of_the_wrong_kind_is_an_input_error_naming_it(option, value, says):
    kwargs = {"backends": ("extern",), "progress": False, option: value}
    with pytest.raises(InputError, match=says):
        gemmtune.tune("mm", torch.randn(3, 4), torch.randn(4, 2), **kwargs)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize("call", [gemmtune.patch, lambda m, **kw: gemmtune.warmup(m, torch.randn(2, 8), **kw)])
def test_a_model_that_is_no_module_is_an_input_error(call):
    with pytest.raises(InputError, match=r"(patch|warmup): model: expected a torch.nn.Module, got int"):
        call(3)


@pytest.mark.parametrize("call", [gemmtune.patch, lambda m, **kw: gemmtune.warmup(m, torch.randn(2, 8), **kw)])
def test_backends_of_the_wrong_kind_is_a_backend_error_and_nothing_is_patched(call):
    model = _mlp()
    with pytest.raises(BackendError, match="backends: expected None, a string or a tuple of family names"):
        call(model, backends=3)
    assert patched_modules(model) == []


@pytest.mark.parametrize("flag, value", [("release", "yes"), ("in_model", 1), ("progress", "y"), ("for_compile", 0)])
def test_a_warmup_flag_that_is_no_bool_is_an_input_error_before_the_forward(flag, value):
    model, calls = _mlp(), []
    model.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(InputError, match=f"warmup: {flag}: expected True, False or None, got {value!r}"):
        gemmtune.warmup(model, torch.randn(2, 8), **{flag: value})
    assert calls == [] and patched_modules(model) == []


def test_a_patch_flag_that_is_no_bool_is_an_input_error():
    with pytest.raises(InputError, match="patch: report: expected True, False or None, got 'stderr'"):
        gemmtune.patch(_mlp(), report="stderr")


def test_a_patched_layer_given_no_tensor_raises_as_an_unpatched_one():
    plain = nn.Linear(8, 4)
    with pytest.raises(TypeError) as unpatched:
        plain("x")
    with pytest.raises(TypeError) as patched:
        gemmtune.patch(nn.Linear(8, 4), backends=("extern",))("x")
    assert str(patched.value) == str(unpatched.value)


@pytest.mark.parametrize("option, value", [("settings", "off"), ("tune_on_miss", "yes"), ("all_threads", 3),
                                           ("extern", 3), ("templates", "nope"), ("fusion", -1), ("gemv", 3)])
def test_an_install_option_of_the_wrong_kind_is_an_input_error_and_nothing_is_installed(option, value):
    import gemmtune.inductor as gi
    from torch._inductor import config

    before = config.inductor_choices_class
    with pytest.raises(InputError, match=f"^{option}: expected"):
        gi.install(**{option: value})
    assert config.inductor_choices_class is before


def test_under_autocast_an_option_of_the_wrong_kind_is_refused_before_the_operands_are_cast(monkeypatch):
    from gemmtune.core import autocast

    monkeypatch.setattr(autocast, "place_operands", lambda *a: pytest.fail("operands moved before the check"))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(InputError, match="progress: expected"):
        gemmtune.tune("mm", torch.randn(3, 4), torch.randn(4, 2), backends=("extern",), progress="yes")
