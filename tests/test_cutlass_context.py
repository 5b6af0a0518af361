"""A CUTLASS template's compile binds the GPU's primary CUDA context in the thread it runs in
(templates/cutlass/disk.py `bind_context`): a compile thread that never made a CUDA call has none,
and the DSL's driver-API module load then fails (CUDA_ERROR_INVALID_CONTEXT).  The driver here is a
stand-in that records what it is asked; it behaves as `cuda.bindings.driver` does."""

from __future__ import annotations

import sys
import types

import pytest

from gemmtune.templates.cutlass import disk


class _Driver(types.ModuleType):
    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_DEVICE = 101

    def __init__(self, current: int = 0, devices: int = 1):
        super().__init__("cuda.bindings.driver")
        self.current, self.devices, self.calls = current, devices, []

    def cuCtxGetCurrent(self):
        self.calls.append("get")
        return self.CUresult.CUDA_SUCCESS, self.current

    def cuDeviceGet(self, index):
        self.calls.append(("device", index))
        ok = index < self.devices
        return (self.CUresult.CUDA_SUCCESS if ok else self.CUresult.CUDA_ERROR_INVALID_DEVICE), index

    def cuDevicePrimaryCtxRetain(self, dev):
        self.calls.append(("retain", dev))
        return self.CUresult.CUDA_SUCCESS, 1000 + dev

    def cuCtxSetCurrent(self, ctx):
        self.calls.append(("set", ctx))
        self.current = ctx
        return (self.CUresult.CUDA_SUCCESS,)


@pytest.fixture
def driver(monkeypatch):
    def install(**kw):
        fake = _Driver(**kw)
        bindings = types.ModuleType("cuda.bindings")
        bindings.driver = fake
        cuda = types.ModuleType("cuda")
        cuda.bindings = bindings
        monkeypatch.setitem(sys.modules, "cuda", cuda)
        monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
        monkeypatch.setitem(sys.modules, "cuda.bindings.driver", fake)
        return fake
    return install


def test_a_thread_without_a_context_gets_the_primary_one_of_its_gpu(driver):
    fake = driver(current=0, devices=2)
    assert disk.bind_context(1) is True
    assert fake.calls == ["get", ("device", 1), ("retain", 1), ("set", 1001)] and fake.current == 1001
    assert disk.bind_context(1) is False and fake.calls[-1] == "get"  # bound already: nothing more


def test_a_thread_with_a_context_keeps_it(driver):
    fake = driver(current=77)
    assert disk.bind_context(0) is False and fake.calls == ["get"] and fake.current == 77


def test_no_gpu_index_a_bad_device_or_no_bindings_do_nothing(driver, monkeypatch):
    fake = driver(current=0, devices=1)
    assert disk.bind_context(None) is False and fake.calls == []
    assert disk.bind_context(3) is False and fake.current == 0
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # not installed
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    assert disk.bind_context(0) is False


def test_a_driver_that_raises_is_not_the_reason_a_compile_fails(driver):
    fake = driver(current=0)

    def broken(index):
        raise RuntimeError("driver not loaded")

    fake.cuDeviceGet = broken
    assert disk.bind_context(0) is False


def test_a_torch_device_names_its_gpu_and_a_cpu_device_binds_nothing(driver):
    import torch

    fake = driver(current=0, devices=2)
    assert disk.bind_context(torch.device("cpu")) is False and fake.calls == []
    assert disk.bind_context(torch.device("cuda", 1)) is True and fake.current == 1001
