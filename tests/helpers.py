"""Small test-only templates."""

import ctypes
import os
import time

import pytest
import torch

from gemmtune.core.choices import Choice
from gemmtune.templates.base import Template, source_hash


class ScriptedTemplate(Template):
    """A generated-kernel stand-in whose compile and results the test controls.

    mode: "ok" (correct torch.mm), "compile_error", "slow_compile", "wrong", and faults at run time
    (CPU stand-ins for GPU fault classes): "crash_run" (the process dies, as after an illegal
    address), "segfault_run" (a real SIGSEGV from a wild write), "hang_run" (never returns),
    "raise_run" (a launch error).
    """

    family = "numba"

    def __init__(self, uid="scripted", mode="ok", n_configs=2, runtime=(1, 2), sleep_s=5.0):
        self.uid, self.mode, self.n_configs, self.sleep_s = uid, mode, n_configs, sleep_s
        self.src_hash = source_hash(f"{uid}:{mode}")
        self.runtime_space = {"group": runtime}
        self.default_runtime = {"group": runtime[-1]}
        self.compiled = []

    def supports(self, ki):
        return True

    def compile_configs(self, ki):
        return [{"TILE": 8 * (i + 1)} for i in range(self.n_configs)]

    def compile(self, choice: Choice, ki, example):
        self.compiled.append(choice.binary_key)
        if self.mode == "compile_error":
            raise RuntimeError("out of resource: shared memory, Required: 999999")
        if self.mode == "slow_compile":
            time.sleep(self.sleep_s)
        wrong = self.mode == "wrong"
        mode = self.mode

        def launch(tensors, out=None, group=1):
            if mode == "crash_run":
                os._exit(134)
            if mode == "segfault_run":
                ctypes.memset(8, 0, 64)  # write to an unmapped page
            if mode == "hang_run":
                time.sleep(10_000)
            if mode == "raise_run":
                raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
            a, b = tensors[-2], tensors[-1]
            res = torch.matmul(a, b)
            if wrong:
                res = res + 1.0
            if out is None:
                return res
            out.copy_(res)
            return out

        return launch


def patched_linear_under_autocast(lin, x, device: str, backends: tuple[str, ...]):
    """(patched output, nn.Linear's output) of `lin(x)` under bf16 autocast on `device`; both bf16."""
    import gemmtune

    with torch.autocast(device, dtype=torch.bfloat16):
        ref = lin(x)
        gemmtune.patch(lin, backends=backends)
        try:
            got = lin(x)
        finally:
            gemmtune.unpatch(lin)
    assert got.dtype == ref.dtype == torch.bfloat16
    return got, ref


def compiled_op_under_autocast(op: str, args, device: str, backends: tuple[str, ...], **compile_kw):
    """(output, torch's output) of gemmtune's `op` compiled with fullgraph under bf16 autocast; both bf16."""
    import gemmtune

    fn = getattr(gemmtune, op)
    compiled = torch.compile(lambda *t: fn(*t, backends=backends), fullgraph=True, **compile_kw)
    with torch.autocast(device, dtype=torch.bfloat16):
        got = compiled(*args)
        ref = getattr(torch, op)(*args)
    assert got.dtype == ref.dtype == torch.bfloat16
    return got, ref


def wait_child(pid: int, timeout_s: float) -> int:
    """A forked child's exit code (a signal as its negative number); killed (-9) if still running at
    the deadline, so a hung child fails the test instead of hanging it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def fresh_inductor(monkeypatch):
    """A memory store, an empty dispatch cache and Dynamo, Inductor's caches off; every handler this test
    installed uninstalled after it (tests of the Inductor handler: `usefixtures("fresh_inductor")`)."""
    import gemmtune
    import gemmtune.inductor as gi
    from torch._inductor import config

    monkeypatch.setenv("GEMMTUNE_STORE", "memory")
    gemmtune.clear_dispatch_cache()
    torch._dynamo.reset()
    with config.patch(fx_graph_cache=False, autotune_local_cache=False):
        yield
    while gi.installer._PRIOR:
        gi.uninstall()
    torch._dynamo.reset()


def fp8_operands(M: int, K: int, N: int, rowwise: bool, a_dtype: torch.dtype = torch.float8_e4m3fn,
                 device: str = "cpu") -> tuple:
    """(a, b, scale_a, scale_b) of a random scaled_mm, quantised as torchao does (the project's own
    `offline.fp8_spec.quantise`: scale = amax / the dtype's max), B = w.t() column-major."""
    from gemmtune.offline.fp8_spec import quantise

    a, sa = quantise(torch.randn(M, K), a_dtype, rowwise)
    w, sw = quantise(torch.randn(N, K), torch.float8_e4m3fn, rowwise)
    return tuple(t.to(device) for t in (a, w.t(), sa, sw.t().contiguous() if rowwise else sw))


def load_bench(name: str):
    """The bench script bench/<name>.py as a module (registered in sys.modules: dataclasses look it up)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"gemmtune_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class TwoGemmNet(torch.nn.Module):
    """A patched layer and a direct gemmtune.mm call: two problems, both reach the dispatch
    (mm(Mx24, 24x16) from the layer, mm(Mx16, 16x8) from the call)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(24, 16, bias=False)
        self.w2 = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import gemmtune

        return gemmtune.mm(torch.relu(self.lin(x)), self.w2)
