"""GPU fault classes under subprocess isolation (run on an H200; skipped without CUDA).

Fault-injection templates live here only and are never shipped as candidates.
"""

import pytest
import torch

import gemmtune
from gemmtune.choices import Choice
from gemmtune.templates.base import Template, source_hash
from gemmtune.templates.extern import AtenTemplate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _fault_kernel(A, B, C, M, N, K, FAULT: tl.constexpr):
    pid = tl.program_id(0)
    if FAULT == 1:  # out-of-bounds write far past the allocation: illegal address
        tl.store(C + (1 << 40) + pid, 1.0)
    if FAULT == 2:  # never finishes
        flag = tl.load(A)
        while flag == flag:
            flag = tl.load(A)
    if FAULT == 3:  # illegal read
        x = tl.load(A + (1 << 40))
        tl.store(C + pid, x)


class FaultTemplate(Template):
    family = "triton"

    def __init__(self, uid, fault):
        self.uid, self.fault = uid, fault
        self.src_hash = source_hash(f"fault:{uid}")

    def supports(self, ki):
        return ki.device_type == "cuda"

    def compile(self, choice: Choice, ki, example):
        fault = self.fault

        def launch(tensors, out=None, **rt):
            a, b = tensors[-2], tensors[-1]
            out = torch.empty(ki.out_size, dtype=ki.dtype, device=a.device) if out is None else out
            _fault_kernel[(1,)](a, b, out, ki.M, ki.N, ki.K, FAULT=fault)
            return out

        return launch


def test_faulty_kernels_are_survived_and_the_context_stays_healthy():
    a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 192, device="cuda", dtype=torch.bfloat16)
    settings = gemmtune.Settings(isolation="subprocess", run_timeout_s=20.0, store="off", strategy="exhaustive")
    templates = [AtenTemplate("mm"), FaultTemplate("oob_write", 1), FaultTemplate("hang", 2),
                 FaultTemplate("illegal_read", 3)]
    sel = gemmtune.tune("mm", a, b, templates=templates, settings=settings)
    status = {t.choice.template_uid: t.status for t in sel.timings}
    assert status["oob_write"] == status["hang"] == status["illegal_read"] == "run_failed", status
    assert sel.winner.template_uid == "aten_mm"
    # The caller's CUDA context is untouched: work still runs and is right.
    torch.testing.assert_close(sel(a, b).float(), (a.float() @ b.float()), rtol=2e-2, atol=0.5)
    torch.cuda.synchronize()


def test_default_tuning_under_isolation_matches_in_process():
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    iso = gemmtune.tune("mm", a, b, settings=gemmtune.Settings(isolation="subprocess", store="off"))
    assert iso.winner_ms is not None and all(t.status in ("ok", "not_benchmarked") for t in iso.timings)
    torch.testing.assert_close(iso(a, b).float(), (a.float() @ b.float()), rtol=2e-2, atol=0.5)
