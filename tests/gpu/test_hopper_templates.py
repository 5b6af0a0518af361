"""GPU tests of the Hopper templates (`triton_tma_persistent`, `triton_splitk`); skipped without CUDA.

Run on an H200:  python -m pytest -q tests/gpu/test_hopper_templates.py -s
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import gemmtune
from gemmtune.measure.correctness import check, reference
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.triton.splitk import TritonSplitKTemplate
from gemmtune.templates.triton.tma import TritonTMAPersistentTemplate
from gpu_operands import operands

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
needs_hopper = pytest.mark.skipif(not HOPPER, reason="TMA needs compute capability >= 9")

TMA_SPACE = [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=3, num_warps=8, EPILOGUE_SUBTILE=1),
             dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=8, EPILOGUE_SUBTILE=0),
             dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_stages=4, num_warps=4, EPILOGUE_SUBTILE=0)]
SPLITK_SPACE = [dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, num_stages=3, num_warps=4),
                dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, SPLIT_K=8, num_stages=4, num_warps=4),
                dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=2, num_stages=3, num_warps=8)]
NEW = ("triton_splitk", "triton_tma_persistent")


def check_all(template, op, tensors, alpha=1.0, beta=1.0):
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    assert template.supports(ki), ki.describe()
    ref = reference(ki, tensors)
    choices = template.configs(ki)
    assert choices
    firsts = {c.binary_key: c for c in choices}
    with ThreadPoolExecutor(8) as pool:  # compile the binaries in parallel, as tune() does
        launchers = dict(zip(firsts, pool.map(lambda c: template.compile(c, ki, tensors), firsts.values())))
    for c in choices:
        launch = launchers[c.binary_key]
        out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype, device="cuda")
        launch(tensors, out, **c.runtime_dict)
        torch.cuda.synchronize()
        assert check(ki, out, ref) is None, (c.key, check(ki, out, ref))
    return ki


# -- triton_tma_persistent -----------------------------------------------------------------------------

@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(1, 4096, 6144), (257, 136, 384), (1000, 1024, 1000), (4097, 4096, 4096)])
def test_tma_correct(dtype, b_layout, shape):
    check_all(TritonTMAPersistentTemplate(space=TMA_SPACE), "mm", operands("mm", *shape, dtype, b_layout))


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tma_addmm(dtype):
    t = TritonTMAPersistentTemplate(space=TMA_SPACE)
    check_all(t, "addmm", operands("addmm", 333, 256, 248, dtype, "col"), alpha=0.5, beta=2.0)
    bias, a, b = operands("addmm", 200, 128, 64, dtype, "row")
    check_all(t, "addmm", (torch.randn(200, 64, dtype=dtype, device="cuda"), a, b), alpha=-1.0, beta=0.5)
    check_all(t, "addmm", (torch.full_like(bias, float("nan")), a, b), beta=0.0)


@needs_hopper
@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_tma_fp32_when_allowed(tf32, b_layout, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    space = [dict(c, num_stages=2) for c in TMA_SPACE]  # fp32 tiles take twice the shared memory
    check_all(TritonTMAPersistentTemplate(space=space, allow_fp32=True), "mm",
              operands("mm", 300, 512, 200, torch.float32, b_layout))


@needs_hopper
@pytest.mark.parametrize("op", ["mm", "addmm"])
@pytest.mark.parametrize("shape", [(1000, 768, 30522), (333, 1280, 51865), (8, 4096, 32001)])
def test_tma_writes_an_output_whose_rows_tma_cannot_store_through_pointers(op, shape):
    tensors = operands(op, *shape, torch.bfloat16, "col")  # a vocabulary head: B = weight.t(), N odd
    check_all(TritonTMAPersistentTemplate(space=TMA_SPACE), op, tensors, alpha=0.5 if op == "addmm" else 1.0)


@needs_hopper
def test_tma_refuses_what_tma_cannot_describe():
    t = TritonTMAPersistentTemplate()
    odd_k = operands("mm", 64, 1001, 64, torch.bfloat16, "row")
    assert not t.supports(KernelInputs.from_tensors("mm", *odd_k))
    assert not t.supports(KernelInputs.from_tensors("bmm", *operands("bmm", 64, 64, 64, torch.bfloat16, "row", batch=2)))


@needs_hopper
def test_tma_launch_from_other_threads_than_the_compile():
    # Triton's allocator lives in a ContextVar: the template installs it in whichever thread launches.
    t = TritonTMAPersistentTemplate(space=TMA_SPACE[:1])
    tensors = operands("mm", 512, 512, 512, torch.bfloat16, "row")
    ki = KernelInputs.from_tensors("mm", *tensors)
    box = {}
    worker = threading.Thread(target=lambda: box.update(launch=t.compile(t.configs(ki)[0], ki, tensors)))
    worker.start()
    worker.join()
    outs = [box["launch"](tensors)]
    other = threading.Thread(target=lambda: outs.append(box["launch"](tensors)))
    other.start()
    other.join()
    torch.cuda.synchronize()
    for out in outs:
        assert check(ki, out, reference(ki, tensors)) is None


# -- triton_splitk ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", [(1, 14336, 4096), (16, 4096, 1000), (257, 8192, 129), (7, 3001, 50)])
def test_splitk_correct(dtype, b_layout, shape):
    check_all(TritonSplitKTemplate(space=SPLITK_SPACE, force=True), "mm", operands("mm", *shape, dtype, b_layout))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_splitk_addmm_and_bmm(dtype):
    t = TritonSplitKTemplate(space=SPLITK_SPACE, force=True)
    check_all(t, "addmm", operands("addmm", 33, 8192, 250, dtype, "col"), alpha=0.5, beta=2.0)
    bias, a, b = operands("addmm", 64, 4096, 64, dtype, "row")
    check_all(t, "addmm", (torch.full_like(bias, float("nan")), a, b), beta=0.0)
    check_all(t, "bmm", operands("bmm", 100, 4096, 130, dtype, "col", batch=5))


def test_splitk_is_deterministic():
    t = TritonSplitKTemplate(space=SPLITK_SPACE[1:2], force=True)
    tensors = operands("mm", 64, 16384, 64, torch.bfloat16, "row")
    ki = KernelInputs.from_tensors("mm", *tensors)
    launch = t.compile(t.configs(ki)[0], ki, tensors)
    first = launch(tensors)
    assert all(torch.equal(first, launch(tensors)) for _ in range(5))


# -- default tuning offers them ----------------------------------------------------------------------

def _tune(M, K, N, b_layout):
    tensors = operands("mm", M, K, N, torch.bfloat16, b_layout)
    sel = gemmtune.tune("mm", *tensors, settings=gemmtune.Settings(store="off"))  # Hopper templates by default
    uids = {t.choice.template_uid for t in sel.timings}
    wrong = [t.choice.key for t in sel.timings if t.choice.template_uid in NEW and t.status == "wrong_result"]
    assert not wrong, wrong
    torch.testing.assert_close(sel(*tensors).float(), (tensors[0].float() @ tensors[1].float()), rtol=2e-2, atol=0.5)
    print(f"\n{M}x{K}x{N}: winner {sel.winner.key} {sel.winner_ms:.4f} ms, {sel.n_choices} choices, "
          f"{sel.tuning_s:.1f} s, templates {sorted(uids)}")
    return sel, uids


@pytest.mark.parametrize("shape,b_layout", [((16, 14336, 4096), "col"), ((256, 65536, 256), "row")])
def test_default_tune_includes_split_k_candidates(shape, b_layout):
    sel, uids = _tune(*shape, b_layout)
    assert "triton_splitk" in uids
    assert any(t.choice.template_uid == "triton_splitk" and t.status == "ok" for t in sel.timings)


@needs_hopper
def test_default_tune_includes_tma_candidates_on_hopper():
    sel, uids = _tune(2048, 2048, 2048, "col")
    assert "triton_tma_persistent" in uids and "triton_splitk" not in uids
    assert any(t.choice.template_uid == "triton_tma_persistent" and t.status == "ok" for t in sel.timings)
