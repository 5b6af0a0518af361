"""GPU fault classes under subprocess isolation (run on an H200; skipped without CUDA).

Fault-injection templates live here only and are never shipped as candidates: compile error,
shared-memory overflow, out-of-bounds write, illegal read, hang, wrong result.
"""

import pytest
import torch

import gemmtune
from gemmtune.core.choices import Choice
from gemmtune.templates.base import Template, source_hash
from gemmtune.templates.extern import AtenTemplate
from gemmtune.templates.triton.mm import TritonMMTemplate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _fault_kernel(A, B, C, M, N, K, FAULT: tl.constexpr):
    pid = tl.program_id(0)
    if FAULT == 1:  # out-of-bounds write far past the allocation: illegal address
        tl.store(C + (1 << 40) + pid, 1.0)
    if FAULT == 2:  # never finishes: volatile loads and a store each turn, so the loop cannot be removed
        flag = tl.load(A, volatile=True)
        while flag == flag:
            tl.store(C + pid, flag)
            flag = tl.load(A, volatile=True)
    if FAULT == 3:  # illegal read
        x = tl.load(A + (1 << 40))
        tl.store(C + pid, x)


@triton.jit
def _broken_kernel(A, C):
    x = tl.load(A + tl.arange(0, 3))  # arange over a non-power-of-two range: a compile error
    tl.store(C + tl.arange(0, 3), x)


class OversizedTriton(TritonMMTemplate):
    """The plain template with one config far beyond the H200's 227 KiB of shared memory."""

    uid = "smem_overflow"

    def compile_configs(self, ki):
        return [dict(BLOCK_M=256, BLOCK_N=256, BLOCK_K=256, num_stages=6, num_warps=8)]


class FaultTemplate(Template):
    family = "triton"

    def __init__(self, uid, fault):
        self.uid, self.fault = uid, fault
        self.src_hash = source_hash(f"fault:{uid}")

    def supports(self, ki):
        return ki.device_type == "cuda"

    def compile(self, choice: Choice, ki, example):
        fault = self.fault
        if fault == 4:  # compile error, raised while compiling (in the caller, as a plain exception)
            _broken_kernel[(1,)](example[-2], torch.empty(4, device=example[-1].device))

        def launch(tensors, out=None, **rt):
            a, b = tensors[-2], tensors[-1]
            out = torch.empty(ki.out_size, dtype=ki.dtype, device=a.device) if out is None else out
            if fault == 5:  # wrong result: a real product, off by one
                return torch.mm(a, b, out=out).add_(1)
            _fault_kernel[(1,)](a, b, out, ki.M, ki.N, ki.K, FAULT=fault)
            return out

        return launch


def test_faulty_kernels_are_survived_and_the_context_stays_healthy():
    a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 192, device="cuda", dtype=torch.bfloat16)
    settings = gemmtune.Settings(isolation="subprocess", run_timeout_s=20.0, store="off", strategy="exhaustive")
    templates = [AtenTemplate("mm"), FaultTemplate("oob_write", 1), FaultTemplate("hang", 2),
                 FaultTemplate("illegal_read", 3), FaultTemplate("compile_error", 4),
                 FaultTemplate("wrong_result", 5), OversizedTriton()]
    sel = gemmtune.tune("mm", a, b, templates=templates, settings=settings)
    status = {t.choice.template_uid: t.status for t in sel.timings}
    print({t.choice.template_uid: (t.status, (t.detail or "")[:120]) for t in sel.timings})
    assert sel.isolation == "subprocess"
    assert status["oob_write"] == status["hang"] == status["illegal_read"] == "run_failed", status
    assert status["compile_error"] == status["smem_overflow"] == "compile_failed", status
    assert status["wrong_result"] == "wrong_result", status
    assert sel.winner.template_uid == "aten_mm"
    # The caller's CUDA context is untouched: work still runs and is right.
    torch.testing.assert_close(sel(a, b).float(), (a.float() @ b.float()), rtol=2e-2, atol=0.5)
    torch.cuda.synchronize()


def test_default_tuning_under_isolation_matches_in_process():
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    iso = gemmtune.tune("mm", a, b, settings=gemmtune.Settings(store="off"))  # "auto": isolated on a GPU
    assert iso.isolation == "subprocess"
    assert iso.winner_ms is not None and all(t.status in ("ok", "not_benchmarked") for t in iso.timings)
    torch.testing.assert_close(iso(a, b).float(), (a.float() @ b.float()), rtol=2e-2, atol=0.5)
    inproc = gemmtune.tune("mm", a, b, settings=gemmtune.Settings(store="off", isolation="off"))
    assert inproc.isolation == "off"
    # Same candidates, both measured fairly: the picks' kernel (GPU) times agree within the H200's
    # drift.  Host launch time is measured in the process that runs the kernel and may differ.
    gpu = [next(t.gpu_ms for t in s.timings if t.choice == s.winner) for s in (iso, inproc)]
    assert 0.8 < gpu[0] / gpu[1] < 1.25, (gpu, iso.winner_ms, inproc.winner_ms)
    print(f"\nisolated {iso.tuning_s:.2f} s ({iso.winner.key} {iso.winner_ms:.4f} ms, GPU {gpu[0]:.4f}) vs "
          f"in-process {inproc.tuning_s:.2f} s ({inproc.winner.key} {inproc.winner_ms:.4f} ms, GPU {gpu[1]:.4f})")


def test_a_kept_worker_serves_the_next_tune_and_a_crash_does_not_poison_it():
    from gemmtune.measure import isolation

    settings = gemmtune.Settings(isolation="subprocess", run_timeout_s=20.0, store="off", strategy="exhaustive")
    a = torch.randn(128, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(64, 96, device="cuda", dtype=torch.float16)
    gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), FaultTemplate("illegal_read", 3)], settings=settings)
    second = gemmtune.tune("mm", a, b, settings=settings.with_(strategy="prescreen"))
    assert all(t.status in ("ok", "not_benchmarked") for t in second.timings)
    assert len(isolation._POOL["cuda:0"]) == 1
    torch.testing.assert_close(second(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=0.5)
