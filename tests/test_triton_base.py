"""The shared base of the Triton templates: source hashes over the kernel file and the shared
device functions, the layering (templates import only the shared base), kernel arguments and the
launch path choice of `KernelLaunch`."""

import ast
import hashlib
from pathlib import Path

import pytest
import torch

from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.triton import base
from gemmtune.templates.triton.gemv import TritonGemvTemplate
from gemmtune.templates.triton.mm import TritonMMTemplate
from gemmtune.templates.triton.skinny import TritonSkinnyTemplate
from gemmtune.templates.triton.splitk import TritonSplitKTemplate
from gemmtune.templates.triton.tma import TritonTMAPersistentTemplate

TRITON_DIR = Path(base.__file__).parent
TEMPLATES = [TritonMMTemplate, TritonSplitKTemplate, TritonSkinnyTemplate, TritonGemvTemplate,
             TritonTMAPersistentTemplate]


@pytest.mark.parametrize("cls", TEMPLATES, ids=lambda c: c.uid)
def test_src_hash_covers_the_kernel_file_and_the_shared_device_functions(cls):
    kernel = (TRITON_DIR / cls.kernel_file).read_bytes()
    common = (TRITON_DIR / "common_kernel.py").read_bytes()
    assert cls.src_hash == hashlib.sha256(kernel + common).hexdigest()
    assert cls.src_hash != hashlib.sha256(kernel).hexdigest()


@pytest.mark.parametrize("cls", TEMPLATES, ids=lambda c: c.uid)
def test_a_change_to_the_shared_device_functions_changes_every_src_hash(cls, tmp_path, monkeypatch):
    edited = tmp_path / "common_kernel.py"
    edited.write_bytes(base.COMMON_KERNEL_FILE.read_bytes() + b"\n# one more line\n")
    monkeypatch.setattr(base, "COMMON_KERNEL_FILE", edited)
    assert base.kernel_hash(cls.kernel_file) != cls.src_hash

    class Edited(cls):  # a template class built while the helper file differs hashes the new text
        kernel_file = cls.kernel_file

    assert Edited.src_hash == base.kernel_hash(cls.kernel_file) != cls.src_hash


def test_src_hashes_differ_between_templates():
    assert len({cls.src_hash for cls in TEMPLATES}) == len(TEMPLATES)


def test_templates_import_only_the_shared_base_and_their_own_kernel():
    """Sibling templates never import each other (nor each other's kernels)."""
    for module in ("mm", "splitk", "skinny", "gemv", "tma"):
        tree = ast.parse((TRITON_DIR / f"{module}.py").read_text())
        local = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
        assert local <= {"base", f"{module}_kernel"}, (module, local)
    for kernel in TRITON_DIR.glob("*_kernel.py"):
        tree = ast.parse(kernel.read_text())
        local = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
        assert local <= {"common_kernel"}, (kernel.name, local)


def test_gemm_args_follow_the_op():
    a, b = torch.ones(3, 5), torch.ones(7, 5).t()
    out = torch.empty(3, 7)
    ki = KernelInputs.from_tensors("mm", a, b)
    args = base.gemm_args(ki, (a, b), out)
    assert args[:4] == (a, b, out, out) and args[4:7] == (3, 7, 5)
    assert args[7:16] == (0, 5, 1, 0, 1, 5, 0, 7, 1) and args[16:] == (0, 0, 1.0, 1.0)
    bias = torch.ones(7)
    ki = KernelInputs.from_tensors("addmm", bias, a, b, alpha=2.0, beta=0.5)
    args = base.gemm_args(ki, (bias, a, b), out)
    assert args[3] is bias and args[16:] == (0, 1, 2.0, 0.5)
    assert base.epilogue_flags(ki) == dict(HAS_BIAS=True, SCALED=True)
    batched = torch.ones(2, 3, 5)
    assert base.batch_strides(batched) == (15, 5, 1) and base.batch_strides(a) == (0, 5, 1)


def test_resource_helpers():
    assert base.smem_limit("cpu") == base.DEFAULT_SMEM == 232_448
    assert base.pipeline_smem(4, 128, 64, 64, 2) == 4 * 192 * 64 * 2
    assert base.acc_regs(128, 256, 8) == 128 == base.ACC_REGS_MAX
    with pytest.raises(ValueError, match="unknown size"):
        base.check_size("huge")


class _Kernel:
    """Records how it was launched, like `kernel[grid](*args, **meta)`."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **meta: self.calls.append((grid, args, meta))


@pytest.mark.parametrize("fast_result, jit_calls", [(None, 1), (False, 1), (True, 0)])
def test_kernel_launch_uses_the_direct_path_when_it_serves(fast_result, jit_calls):
    kernel, seen = _Kernel(), []

    def fast(args):
        seen.append(args)
        return fast_result

    run = base.KernelLaunch(kernel, (2, 1, 1), {"BLOCK": 16}, fast=None if fast_result is None else fast)
    run((1, 2))
    assert len(kernel.calls) == jit_calls and len(seen) == (fast_result is not None)
    if jit_calls:
        assert kernel.calls[0] == ((2, 1, 1), (1, 2), {"BLOCK": 16})


def test_supports_asks_every_check(monkeypatch):
    ki = KernelInputs.from_tensors("mm", torch.ones(8, 64), torch.ones(64, 8))
    t = TritonMMTemplate()
    monkeypatch.setattr(base, "interpreting", lambda: True)
    assert t.supports(ki) == base.triton_available()
    monkeypatch.setattr(base, "interpreting", lambda: False)
    assert not t.supports(ki)  # CPU without the interpreter
    monkeypatch.setattr(base, "interpreting", lambda: True)
    assert not t.supports(KernelInputs.from_tensors("mm", torch.ones(8, 64).double(), torch.ones(64, 8).double()))
