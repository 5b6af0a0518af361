"""The `cutlass_operators` template's logic on the CPU, against a fake of nvidia-cutlass-operators'
API (`get_operators`, `GemmArguments`, `EpilogueArguments`, operators with `metadata.design`,
`compile`, `run`): its configs are the operators the library returns, it has no runtime params,
each choice's src_hash names the library version and the operator, addmm's bias is fused where the
library offers it and added after the GEMM where not, and without the library it is skipped."""

import json
import types

import pytest
import torch

from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.cutlass import operators as tmod
from gemmtune.templates.cutlass.operators import CutlassOperatorsTemplate, choice_src_hash, template_src_hash


class Design(types.SimpleNamespace):
    def __repr__(self):
        return f"BLASDesignMetadata(tile_shape={self.tile_shape}, cluster_shape={self.cluster_shape})"


class Sm90StaticPersistentGemmOperator:
    """Shaped as the library's: `metadata.design`, `compile(args, target_sm)`, `run(args, artifact, ...)`."""

    compiles = 0

    def __init__(self, tile, cluster, lib):
        self.metadata = types.SimpleNamespace(design=Design(tile_shape=tile, cluster_shape=cluster, num_smem_stages=None))
        self.lib = lib

    def compile(self, args, target_sm=None):
        type(self).compiles += 1
        return self.lib.CompiledArtifact(compiled_obj="binary", operator_obj=self, compiled_for=target_sm)

    def run(self, args, compiled_artifact=None, stream=None, workspace=None, assume_supported_args=False):
        assert compiled_artifact.operator_obj is self
        acc = (args.A.float() @ args.B.float())
        if args.epilogue is not None:
            e = args.epilogue.kw
            acc = acc * e["alpha"] + e["C"].float() * e["beta"]
        args.out.copy_(acc)


def fake_library(fuses_bias=False, tvm_ffi=False):
    lib = types.SimpleNamespace(__version__="0.3.0", calls=[])
    lib.GemmArguments = lambda A, B, out, accumulator_type, epilogue=None: types.SimpleNamespace(
        A=A, B=B, out=out, accumulator_type=accumulator_type, epilogue=epilogue)
    lib.EpilogueArguments = lambda fn, **kw: types.SimpleNamespace(fn=fn, kw=kw)
    lib.GlobalOptions = lambda: types.SimpleNamespace(use_tvm_ffi=tvm_ffi)
    lib.CompiledArtifact = lambda **kw: types.SimpleNamespace(**kw)
    lib.TargetSm = str

    def get_operators(args, target_sm=None):
        lib.calls.append((args, target_sm))
        if args.epilogue is not None and not fuses_bias:
            return []
        return [Sm90StaticPersistentGemmOperator((m, n, 64), (cm, cn, 1), lib)
                for m in (64, 128) for n in (64, 128, 256) for cm in (1, 2) for cn in (1, 2)]

    lib.get_operators = get_operators
    return lib


A, W, BIAS = torch.randn(64, 32), torch.randn(48, 32), torch.randn(48)


def ki_of(op, *tensors, **kw):
    ki = KernelInputs.from_tensors(op, *tensors, **kw)
    return ki


def test_configs_are_the_operators_the_library_returns_and_no_runtime_params():
    lib = fake_library()
    t = CutlassOperatorsTemplate(library=lib, target="90a")
    ki = ki_of("mm", A, W.t())
    cfgs = t.compile_configs(ki)
    assert len(cfgs) == 24 and {c["operator"] for c in cfgs} == {"Sm90StaticPersistentGemmOperator"}
    assert {(c["tile_m"], c["tile_n"]) for c in cfgs} == {(m, n) for m in (64, 128) for n in (64, 128, 256)}
    assert {c["epilogue"] for c in cfgs} == {"none"} and {c["stages"] for c in cfgs} == {0}
    args, target = lib.calls[-1]
    assert target == "90a" and args.accumulator_type == torch.float32 and args.A.device.type == "meta"
    assert args.B.stride() == W.t().stride()  # the problem's layouts, not copies
    choices = t.configs(ki)
    assert len(choices) == 24 and all(dict(c.runtime) == {} for c in choices)
    assert dict(t.runtime_space) == {}


def test_each_choice_src_hash_names_the_library_version_and_the_operator():
    t = CutlassOperatorsTemplate(library=fake_library(), target="90a")
    choices = t.configs(ki_of("mm", A, W.t()))
    assert len({c.src_hash for c in choices}) == len(choices)  # the design enters each hash
    assert template_src_hash("0.3.0", "4.8.1") != template_src_hash("0.3.1", "4.8.1")
    assert template_src_hash("0.3.0", "4.8.1") != template_src_hash("0.3.0", "4.9.0")
    op = t.operators(ki_of("mm", A, W.t()))[0][0]
    identity = f"{__name__}.Sm90StaticPersistentGemmOperator:{op.metadata.design!r}"
    assert choices[0].src_hash == choice_src_hash(t.src_hash, identity)


def test_operators_keeps_only_the_named_classes():
    t = CutlassOperatorsTemplate(library=fake_library(), target="90a", operators=["Sm80TensorOpGemmOperator"])
    assert t.compile_configs(ki_of("mm", A, W.t())) == []


@pytest.mark.parametrize("fuses", [False, True])
def test_addmm_bias_is_fused_where_the_library_offers_it_else_added_after(fuses):
    lib = fake_library(fuses_bias=fuses)
    t = CutlassOperatorsTemplate(library=lib, target="90a")
    tensors = (BIAS, A, W.t())
    ki = ki_of("addmm", *tensors, alpha=0.5, beta=2.0)
    cfgs = t.compile_configs(ki)
    assert {c["epilogue"] for c in cfgs} == {"fused" if fuses else "separate"}
    asked = lib.calls[0][0].epilogue
    assert asked is not None and asked.kw["beta"] == 2.0 and asked.kw["C"].shape == (64, 48)
    choice = t.configs(ki)[5]
    launch = t.compile(choice, ki, tensors)
    out = launch(tensors)
    torch.testing.assert_close(out, torch.addmm(BIAS, A, W.t(), alpha=0.5, beta=2.0), rtol=1e-5, atol=1e-5)


def test_one_compile_per_choice_and_the_call_arguments_built_on_every_call():
    """A timing loop passes the same tensors every time, a dispatched call a new output: arguments kept
    across calls made the timed host cost (18 us on the H200 host) a fraction of every real call's
    (332-380 us), so a pick that lost on the host won the tune.  Both now pay the same."""
    lib = fake_library()
    t = CutlassOperatorsTemplate(library=lib, target="90a")
    ki = ki_of("mm", A, W.t())
    before = Sm90StaticPersistentGemmOperator.compiles
    launch = t.compile(t.configs(ki)[0], ki, (A, W.t()))
    out = torch.empty(64, 48)
    built = []
    real = lib.GemmArguments
    lib.GemmArguments = lambda *a, **k: built.append(1) or real(*a, **k)
    launch((A, W.t()), out)
    launch((A, W.t()), out)
    assert Sm90StaticPersistentGemmOperator.compiles == before + 1 and len(built) == 2
    torch.testing.assert_close(out, A @ W.t())
    launch((A, W.t()))  # a new output, as a dispatched call has
    assert len(built) == 3


def test_a_config_no_operator_matches_is_a_clear_error():
    t = CutlassOperatorsTemplate(library=fake_library(), target="90a")
    ki = ki_of("mm", A, W.t())
    bad = t.configs(ki)[0]
    bad = type(bad)(bad.template_uid, bad.src_hash, tuple((k, 96 if k == "tile_n" else v) for k, v in bad.config),
                    bad.runtime, family=bad.family)
    with pytest.raises(ValueError, match="no operator of the library matches"):
        t.compile(bad, ki, (A, W.t()))


def test_without_the_library_it_is_skipped_with_a_reason(monkeypatch):
    monkeypatch.setattr(tmod, "library_importable", lambda: False)
    tmod.unavailable_reason.cache_clear()
    try:
        t = CutlassOperatorsTemplate()
        assert not t.available() and "nvidia-cutlass-operators is not installed" in t.unavailable()
        assert not t.supports(ki_of("mm", A.cuda() if torch.cuda.is_available() else A, W.t()))
    finally:
        tmod.unavailable_reason.cache_clear()


def test_cpu_problems_are_not_supported():
    t = CutlassOperatorsTemplate(library=fake_library(), target="90a")
    assert not t.supports(ki_of("mm", A, W.t()))  # a CPU tensor


def test_the_template_pickles_for_an_isolated_worker_with_its_library_by_name():
    """A worker process gets the template by pickle; the library is a module, which does not pickle
    (on the H200 a pool naming cutlass fell back to measuring in the caller).  The module travels by
    name and the operators found so far stay behind."""
    import pickle

    t = CutlassOperatorsTemplate(library=json, target="90a")
    t._found[("mm",)] = ([object()], "none")
    back = pickle.loads(pickle.dumps(t))
    assert back.library is json and back._found == {} and back.target() == "90a" and t._found


class Kernel:
    """A compiled kernel as TVM-FFI calls it: `kernel(A, B, out, stream)` on the tensors themselves;
    `wrong` writes something else, `fails` raises."""

    def __init__(self, wrong=False, fails=False):
        self.calls, self.wrong, self.fails = [], wrong, fails

    def __call__(self, a, b, out, stream):
        self.calls.append((a.data_ptr(), b.data_ptr(), out.data_ptr(), stream))
        if self.fails:
            raise TypeError("kernel() takes 3 arguments")
        out.copy_(a.float() @ b.float() + (1e-3 if self.wrong else 0.0))


def _direct_launch(monkeypatch, lib, kernel, op="mm", direct=True):
    """A launcher of the first config with `kernel` as the compiled kernel; `ran`: the library's runs."""
    monkeypatch.setattr(Sm90StaticPersistentGemmOperator, "compile", lambda self, args, target_sm=None:
                        lib.CompiledArtifact(compiled_obj=kernel, operator_obj=self, compiled_for=target_sm))
    ran = []
    real_run = Sm90StaticPersistentGemmOperator.run
    monkeypatch.setattr(Sm90StaticPersistentGemmOperator, "run", lambda self, *a, **k: ran.append(1) or real_run(
        self, *a, **k))
    tensors = (BIAS, A, W.t()) if op != "mm" else (A, W.t())
    ki = ki_of("addmm" if op != "mm" else "mm", *tensors)
    t = CutlassOperatorsTemplate(library=lib, target="90a", direct=direct)
    return t.compile(t.configs(ki)[0], ki, tensors), tensors, ran


@pytest.mark.parametrize("direct, tvm_ffi, op, runs_kernel", [
    (True, True, "mm", True),  # the default: the compiled kernel, called with the tensors
    (False, True, "mm", False),  # the library's run on its arguments
    (True, False, "mm", False),  # TVM-FFI off: the arguments convert the tensors
    (True, True, "addmm_fused", False),  # a fused epilogue takes more arguments
    (True, True, "mm@0.4.0", False)])  # a library version whose run was not read
def test_direct_calls_the_compiled_kernel_only_where_the_librarys_run_would(monkeypatch, direct, tvm_ffi, op,
                                                                             runs_kernel):
    op, _, version = op.partition("@")
    lib = fake_library(fuses_bias=op == "addmm_fused", tvm_ffi=tvm_ffi)
    lib.__version__ = version or lib.__version__
    kernel = Kernel()
    launch, tensors, ran = _direct_launch(monkeypatch, lib, kernel, op, direct)
    assert CutlassOperatorsTemplate(library=lib).direct
    want = torch.addmm(BIAS, A, W.t()) if op != "mm" else A @ W.t()
    first = launch(tensors)  # the library's run; the kernel's own call is checked against it once
    torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-5)
    assert ran == [1] and len(kernel.calls) == runs_kernel
    kernel.calls.clear()
    out = launch(tensors)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert (kernel.calls == [(A.data_ptr(), W.data_ptr(), out.data_ptr(), None)]) == runs_kernel
    assert (ran == [1]) == runs_kernel


@pytest.mark.parametrize("kernel", [Kernel(wrong=True), Kernel(fails=True)], ids=["differs", "raises"])
def test_a_kernel_whose_own_call_differs_from_the_run_keeps_the_run(monkeypatch, caplog, kernel):
    launch, tensors, ran = _direct_launch(monkeypatch, fake_library(tvm_ffi=True), kernel)
    with caplog.at_level("INFO", logger="gemmtune"):
        outs = [launch(tensors) for _ in range(3)]
    for out in outs:
        torch.testing.assert_close(out, A @ W.t(), rtol=1e-5, atol=1e-5)
    assert ran == [1, 1, 1] and len(kernel.calls) == 1  # checked once, then never called again
    assert "using the library's run" in caplog.text


@pytest.mark.parametrize("size, mnk, expected", [
    ("default", (64, 48, 32), 24),      # small (explicit backends): every operator
    ("default", (2048, 2048, 2048), 8),  # large: the 128x256 and 128x128 designs, 4 clusters each
    ("max", (2048, 2048, 2048), 24),     # the "max" space: every operator
])
def test_large_problems_compile_a_shortlist_of_the_operators_in_the_default_space(size, mnk, expected):
    m, n, k = mnk
    t = CutlassOperatorsTemplate(size=size, library=fake_library(), target="90a")
    a, b = torch.empty(m, k, dtype=torch.bfloat16), torch.empty(n, k, dtype=torch.bfloat16).t()
    cfgs = t.compile_configs(KernelInputs.from_tensors("mm", a, b))
    assert len(cfgs) == expected
    if expected == 8:
        assert {(c["tile_m"], c["tile_n"]) for c in cfgs} == {(128, 256), (128, 128)}
        assert {(c["cluster_m"], c["cluster_n"]) for c in cfgs} == {(1, 1), (1, 2), (2, 1), (2, 2)}


def test_a_shortlist_the_library_does_not_offer_keeps_every_operator():
    lib = fake_library()
    offered = lib.get_operators

    def small_tiles_only(args, target_sm=None):
        return [op for op in offered(args, target_sm) if op.metadata.design.tile_shape[0] == 64]

    lib.get_operators = small_tiles_only
    t = CutlassOperatorsTemplate(library=lib, target="90a")
    a, b = torch.empty(2048, 4096, dtype=torch.bfloat16), torch.empty(2048, 4096, dtype=torch.bfloat16).t()
    assert len(t.compile_configs(KernelInputs.from_tensors("mm", a, b))) == 12
