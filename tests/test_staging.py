"""Kept zero-padded storage for padded candidates (gemmtune.templates.staging): one storage per operand,
thread and shape, reused call after call with its padding still zero; parameters, operands that need
gradients, tensor subclasses and storage past the byte bound are padded anew.  Real kernels: torch's
ops through `PaddedTemplate(AtenTemplate)` on CPU."""

from __future__ import annotations

import threading

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gemmtune.core.inputs import KernelInputs
from gemmtune.templates import staging
from gemmtune.templates.extern import AtenTemplate
from gemmtune.templates.padded import PaddedTemplate
from gemmtune.templates.staging import kept_bytes, staged_padder


@pytest.fixture(autouse=True)
def _empty():
    staging.forget()
    yield
    staging.forget()


def _launcher(op, *tensors):
    ki = KernelInputs.from_tensors(op, *tensors)
    t = PaddedTemplate(AtenTemplate(op))
    return t.compile(t.configs(ki)[0], ki, tensors)


def _anew(t):
    return torch.constant_pad_nd(t, [0, 8 - t.shape[-1], 0, 0])


def test_an_operand_is_copied_into_the_same_zero_padded_storage_on_every_call():
    pad = staged_padder(True, 3, 8, _anew, "a")
    first = pad(torch.full((3, 5), 7.0))
    again = pad(torch.full((3, 5), -2.0))
    assert again.data_ptr() == first.data_ptr() and kept_bytes() == 3 * 8 * 4
    assert again[:, :5].eq(-2.0).all() and again[:, 5:].eq(0.0).all()
    col = staged_padder(False, 8, 3, _anew, "b")(torch.ones(3, 5).t())  # column-major: padded down its rows
    assert col.shape == (8, 3) and col.stride() == (1, 8) and col[5:].eq(0.0).all() and col[:5].eq(1.0).all()


def test_a_and_b_of_one_call_never_share_storage():
    a, b = torch.randn(13, 13).t(), torch.randn(13, 13).t()  # column-major: both padded to 16 x 16
    launch = _launcher("mm", a, b)
    for _ in range(2):
        torch.testing.assert_close(launch((a, b), None), a @ b)


def test_a_smaller_operand_never_sees_a_larger_ones_values_in_its_padding():
    wide, narrow = torch.randn(6, 7), torch.randn(6, 5)  # both padded to 6 x 8 (float32: 4 per 16 bytes)
    b_wide, b_narrow = torch.randn(7, 4), torch.randn(5, 4)
    big, small = _launcher("mm", wide, b_wide), _launcher("mm", narrow, b_narrow)
    big((wide, b_wide), None)
    torch.testing.assert_close(small((narrow, b_narrow), None), narrow @ b_narrow)
    torch.testing.assert_close(big((wide, b_wide), None), wide @ b_wide)


def test_each_thread_gets_storage_of_its_own():
    pad = staged_padder(True, 4, 8, _anew, "a")
    mine = pad(torch.ones(4, 5)).data_ptr()
    seen = []
    worker = threading.Thread(target=lambda: seen.append(pad(torch.ones(4, 5)).data_ptr()))
    worker.start()
    worker.join()
    assert seen and seen[0] != mine and pad(torch.ones(4, 5)).data_ptr() == mine


def test_a_weights_kept_copy_is_never_the_storage_other_operands_are_copied_into():
    linear = torch.nn.Linear(21, 19, bias=False)
    x = torch.randn(13, 21)
    launch = _launcher("mm", x, linear.weight.t())
    with torch.no_grad():
        want = x @ linear.weight.t()
        torch.testing.assert_close(launch((x, linear.weight.t()), None), want)
        other = torch.randn(19, 21).t()  # not a parameter, the weight's shape and layout: copied into storage
        torch.testing.assert_close(launch((x, other), None), x @ other)
        torch.testing.assert_close(launch((x, linear.weight.t()), None), want)


def test_an_operand_that_needs_gradients_or_is_a_subclass_is_padded_anew():
    pad = staged_padder(True, 2, 8, _anew, "a")
    grad = torch.ones(2, 5, requires_grad=True)
    assert pad(grad).data_ptr() != pad(grad).data_ptr() and kept_bytes() == 0
    with torch.no_grad():
        assert pad(grad).data_ptr() == pad(grad).data_ptr() and kept_bytes() == 2 * 8 * 4
    staging.forget()
    with FakeTensorMode() as mode:
        fake = pad(mode.from_tensor(torch.ones(2, 5)))
    assert fake.shape == (2, 8) and kept_bytes() == 0


def test_storage_kept_inside_inference_mode_serves_calls_outside_it():
    a, b = torch.randn(9, 7), torch.randn(7, 6)
    launch = _launcher("mm", a, b)
    with torch.inference_mode():
        torch.testing.assert_close(launch((a, b), None), a @ b)
    assert kept_bytes() > 0
    a2 = torch.randn(9, 7)
    torch.testing.assert_close(launch((a2, b), None), a2 @ b)


def test_the_kept_bytes_stay_bounded_and_a_larger_matrix_is_padded_anew(monkeypatch):
    monkeypatch.setattr(staging, "MAX_BYTES", 1000)
    pads = [staged_padder(True, r, 8, _anew, "a") for r in range(1, 12)]
    for r, pad in enumerate(pads, start=1):
        assert pad(torch.full((r, 5), float(r)))[:, :5].eq(float(r)).all()
        assert kept_bytes() <= 1000
    assert kept_bytes() > 0
    big = staged_padder(True, 40, 8, _anew, "a")  # 1,280 bytes alone
    assert big(torch.ones(40, 5)).data_ptr() != big(torch.ones(40, 5)).data_ptr()


def test_the_least_recently_used_storage_is_dropped_first(monkeypatch):
    monkeypatch.setattr(staging, "MAX_BYTES", 3 * 4 * 8 * 4)  # room for three 4x8 float32 storages
    pads = [staged_padder(True, 4, 8, _anew, slot) for slot in "abcd"]
    held = [pad(torch.ones(4, 5)) for pad in pads[:3]]  # held here, a dropped storage's memory is not reused
    first = [t.data_ptr() for t in held]
    assert pads[0](torch.ones(4, 5)).data_ptr() == first[0]  # "a" used again: "b" is now the oldest
    pads[3](torch.ones(4, 5))  # a fourth: one must go
    assert pads[0](torch.ones(4, 5)).data_ptr() == first[0] and pads[2](torch.ones(4, 5)).data_ptr() == first[2]
    assert pads[1](torch.ones(4, 5)).data_ptr() != first[1]  # "b" was dropped
    assert kept_bytes() == 3 * 4 * 8 * 4


def test_a_forked_child_starts_with_a_free_lock_and_no_helper_thread(monkeypatch):
    held = staging._LOCK
    monkeypatch.setattr(staging, "_LOCK", held)
    with held:  # a fork taken while another thread holds the lock
        staging._after_fork()
        assert staging._LOCK is not held and staging._LOCK.acquire(timeout=1)
        staging._LOCK.release()
    assert staging._HELPER == [] and staging._SIDE == {}


@pytest.mark.parametrize("op", ["bmm", "addmm"])
def test_a_padded_batched_or_biased_product_stays_right_call_after_call(op):
    if op == "bmm":
        tensors = (torch.randn(3, 9, 7), torch.randn(3, 7, 5))
        want = lambda t: torch.bmm(*t)  # noqa: E731
    else:
        tensors = (torch.randn(5), torch.randn(9, 7), torch.randn(7, 5))
        want = lambda t: torch.addmm(*t)  # noqa: E731
    launch = _launcher(op, *tensors)
    for _ in range(2):
        torch.testing.assert_close(launch(tensors, None), want(tensors))
        tensors = tuple(torch.randn_like(t) for t in tensors)


@pytest.mark.parametrize("needs_grad", ["a", "b", "weight"])
def test_calls_autograd_records_never_share_storage_and_backward_sees_each_calls_operands(needs_grad):
    x1, x2, w = torch.randn(13, 21), torch.randn(13, 21), torch.randn(21, 19)
    linear = torch.nn.Linear(21, 19, bias=False)
    launch = _launcher("mm", x1, w)
    ones = torch.ones(13, 19)
    for _ in range(2):  # twice: nothing kept from the first backward serves the second
        a1, a2 = x1.clone().requires_grad_(needs_grad == "a"), x2.clone().requires_grad_(needs_grad == "a")
        b = linear.weight.t() if needs_grad == "weight" else w.clone().requires_grad_(needs_grad == "b")
        linear.weight.grad = None
        y1, y2 = launch((a1, b), None), launch((a2, b), None)
        (y1.sum() + 2 * y2.sum()).backward()
        if needs_grad == "a":
            torch.testing.assert_close(a1.grad, ones @ b.t())
            torch.testing.assert_close(a2.grad, 2 * ones @ b.t())
        else:
            got = linear.weight.grad.t() if needs_grad == "weight" else b.grad
            torch.testing.assert_close(got, x1.t() @ ones + 2 * x2.t() @ ones)
    assert kept_bytes() == 0


def test_a_call_under_vmap_pads_anew_and_computes_each_product():
    a, b = torch.randn(3, 9, 7), torch.randn(7, 6)
    launch = _launcher("mm", a[0], b)
    got = torch.vmap(lambda t: launch((t, b), None))(a)
    torch.testing.assert_close(got, a @ b)
    assert kept_bytes() == 8 * 8 * 4  # B's storage (8 x 8, float32), not the batched A's


def test_the_kept_storage_is_freed_when_the_dispatch_cache_is_cleared_and_after_a_tune():
    import gemmtune

    a, b = torch.randn(9, 7), torch.randn(7, 6)
    launch = _launcher("mm", a, b)
    launch((a, b), None)
    assert kept_bytes() > 0
    gemmtune.clear_dispatch_cache()
    assert kept_bytes() == 0
    launch((a, b), None)
    pool = [AtenTemplate("mm"), PaddedTemplate(AtenTemplate("mm"))]  # the tune times the twin: storage kept
    sel = gemmtune.tune("mm", a, b, backends=("extern",), templates=pool, settings=gemmtune.Settings(store="off"))
    assert "padded_aten_mm" in {t.choice.template_uid for t in sel.timings if t.ms is not None}
    assert kept_bytes() == 0  # and freed when the tune's runner closed
