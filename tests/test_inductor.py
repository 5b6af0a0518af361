"""gemmtune feeding Inductor's lookup table (`gemmtune.inductor`), on CPU with the installed torch.

CPU Inductor consults the choices handler for mm / addmm / bmm under max-autotune (the aten kernels
are its only templates there), so the key, the hit, the miss-tunes path and the benchmark count are
tested for real here; Triton entries are built in tests/test_inductor_entries.py and run in
tests/gpu/test_inductor_gpu.py.
"""

from __future__ import annotations

import pickle
import sys

import pytest
import torch

import gemmtune
import gemmtune.inductor as gi
from gemmtune.cli import main
from gemmtune.core.inputs import KernelInputs
from gemmtune.inductor import compat, tuning

from helpers import fresh_inductor  # noqa: F401 - the fixture

pytestmark = [pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table"),
              pytest.mark.usefixtures("fresh_inductor")]


def linear_relu_mm(x, w, b, y):
    return torch.nn.functional.linear(x, w, b).relu() @ y


def operands():
    return torch.randn(64, 32), torch.randn(48, 32), torch.randn(48), torch.randn(48, 16)


def problems(x, w, b, y):
    """gemmtune's view of the two GEMMs of `linear_relu_mm`."""
    h = torch.nn.functional.linear(x, w, b).relu()
    return KernelInputs.from_tensors("addmm", b, x, w.t()), KernelInputs.from_tensors("mm", h, y)


# -- keys ----------------------------------------------------------------------------------------

def test_keys_equal_torch_make_lookup_key_for_real_kernel_inputs(monkeypatch):
    """Inductor's own LookupTableChoices key of every kernel input it lowers is one of ours."""
    from torch._inductor.lookup_table import LookupTableChoices

    # the stock handler answers None off CUDA; give it a device key so its key function runs on CPU
    monkeypatch.setattr(LookupTableChoices, "_get_device_key", staticmethod(lambda device: device.type))
    seen = []

    class Spy(LookupTableChoices):
        def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides=None):
            seen.append((op_name, LookupTableChoices().make_lookup_key(kernel_inputs, op_name)))
            return super()._finalize_template_configs(template_choices, kernel_inputs, templates, op_name,
                                                      kwarg_overrides)

    from torch._inductor.virtualized import V

    args = operands()
    a, c = torch.randn(3, 8, 4), torch.randn(3, 4, 5)
    with V.set_choices_handler(Spy()):
        torch.compile(linear_relu_mm, mode="max-autotune", fullgraph=True)(*args)
        torch._dynamo.reset()
        torch.compile(torch.bmm, mode="max-autotune", fullgraph=True)(a, c)
    ki_addmm, ki_mm = problems(*args)
    ours = {"addmm": gi.problem_keys(ki_addmm), "mm": gi.problem_keys(ki_mm),
            "bmm": gi.problem_keys(KernelInputs.from_tensors("bmm", a, c))}
    assert {op for op, _ in seen} == {"addmm", "mm", "bmm"}
    for op, key in seen:
        assert key in ours[op], (op, key, ours[op])


# -- the installed handler -------------------------------------------------------------------------

def test_exported_aten_entries_are_the_only_choices_and_nothing_is_benchmarked():
    from torch._inductor.utils import run_and_get_code

    args = operands()
    ki_addmm, ki_mm = problems(*args)
    h = torch.nn.functional.linear(args[0], args[1], args[2]).relu()
    sels = [gemmtune.tune("addmm", args[2], args[0], args[1].t(), backends=("extern",)),
            gemmtune.tune("mm", h, args[3], backends=("extern",))]
    table = gi.table_for(sels)
    assert table[gi.problem_keys(ki_mm)[0]] == [{"template_id": "aten::mm"}]
    with gi.installed(table, tune_on_miss=False) as handler, gi.benchmark_probe() as probe:
        f = torch.compile(linear_relu_mm, mode="max-autotune", fullgraph=True)
        out, code = run_and_get_code(f, *args)
    torch.testing.assert_close(out, linear_relu_mm(*args))
    assert probe.choices == 0 and probe.autotuned == 0
    assert handler.stats["hit"] == 2 and handler.stats["miss"] == 0 and handler.stats["tuned"] == 0
    text = "\n".join(code)
    assert "extern_kernels.addmm" in text and "extern_kernels.mm" in text


def test_benchmark_probe_counts_what_inductor_times():
    """The control: a key with two entries (a non-exact pick) makes Inductor time two choices."""
    x, y = torch.randn(64, 32), torch.randn(32, 16)
    key = gi.problem_keys(KernelInputs.from_tensors("mm", x, y))[0]
    table = {key: [{"template_id": "aten::mm"}, {"template_id": "aten::mm"}]}
    with gi.installed(table, tune_on_miss=False), gi.benchmark_probe() as probe:
        torch.compile(lambda a, b: (a @ b).relu(), mode="max-autotune-no-cudagraphs", fullgraph=True)(x, y)
    assert probe.choices == 2 and probe.autotuned == 1


def test_a_miss_tunes_with_gemmtune_then_the_warm_store_answers(monkeypatch):
    made = []
    real = tuning.pick_for_selection
    monkeypatch.setattr(tuning, "pick_for_selection", lambda sel, few=2, fusion=2, **kw: made.append(sel) or real(sel, few, fusion, **kw))
    args = operands()
    for _ in range(2):  # cold store, then a fresh handler on the warm store
        with gi.installed() as handler, gi.benchmark_probe() as probe:
            out = torch.compile(linear_relu_mm, mode="max-autotune", fullgraph=True)(*args)
        torch._dynamo.reset()
        torch.testing.assert_close(out, linear_relu_mm(*args))
        assert handler.stats["tuned"] == 2 and probe.choices == 0
    assert [s.problem.op for s in made] == ["addmm", "mm", "addmm", "mm"]
    assert [s.cache_hit for s in made] == [False, False, True, True]
    assert all(s.winner.template_uid.startswith("aten_") for s in made)  # CPU: the exact pool is aten


def test_unknown_ops_and_uninstall_leave_inductor_alone():
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    from torch._inductor import config

    before, factory = V.choices, config.inductor_choices_class
    handler = gi.install(tune_on_miss=False)
    assert V.choices is handler and isinstance(handler, gi.require())
    assert config.inductor_choices_class() is handler and isinstance(handler.uuid(), str)  # other threads too
    # Inductor's FX-graph cache key pickles the config on some torch versions: the factory pickles.
    assert pickle.loads(pickle.dumps(config.inductor_choices_class)) == handler.uuid()
    gi.uninstall()
    assert V.choices is before and isinstance(V.choices, InductorChoices)
    assert config.inductor_choices_class is factory
    gi.install(tune_on_miss=False, all_threads=False)
    assert config.inductor_choices_class is factory


# -- from the store, and the command line -----------------------------------------------------------

def test_the_store_exports_under_the_keys_inductor_asks():
    x, w, b = torch.randn(16, 8), torch.randn(12, 8), torch.randn(12)
    gemmtune.tune("mm", x, w.t(), backends=("extern",))
    gemmtune.tune("addmm", b, x, w.t(), backends=("extern",))
    gemmtune.tune("mm", x, w.t(), backends=("extern",), alpha=1.0)  # same problem
    gemmtune.tune("addmm", b, x, w.t(), alpha=2.0, backends=("extern",))  # scalars the store does not keep
    made = gi.export_table()
    for ki in (KernelInputs.from_tensors("mm", x, w.t()), KernelInputs.from_tensors("addmm", b, x, w.t())):
        assert all(key in made.table for key in gi.problem_keys(ki))
    assert len(made.picks) == 2 and len(made.skipped) == 1 and "not recoverable" in made.skipped[0]


def test_cli_writes_the_table(tmp_path, capsys):
    gemmtune.tune("mm", torch.randn(16, 8), torch.randn(8, 4), backends=("extern",))
    path = tmp_path / "t.json"
    assert main(["inductor-table", "--out", str(path)]) == 0
    assert gi.read_table(path) and "wrote 1 keys for 1 problems" in capsys.readouterr().out
    assert main(["inductor-table", "--out", str(path), "--shape", "32x16x8", "--device", "cpu", "--op", "bmm",
                 "--batch", "2"]) == 0
    assert list(gi.read_table(path))[0].endswith("+bmm")


@pytest.mark.parametrize("args,needle", [
    (["inductor-table"], "--out"),
    (["inductor-table", "--out", "x.json", "--shape", "4x4"], "--shape"),
    (["inductor-table", "--out", "x.json", "--shape", "4x4x4", "--device", "tpu"], "--device"),
    (["inductor-table", "--out", "x.json", "--device", "tpu"], "--device"),
    (["inductor-table", "--out", "x.json", "--few", "0"], "--few"),
    (["inductor-table", "--out", "x.json", "--templates", "some"], "--templates"),
])
def test_cli_errors_are_one_line_exit_2(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gemmtune") and "error:" in err[0] and needle in err[0]


def test_a_torch_without_the_lookup_table_is_a_typed_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch._inductor.lookup_table", None)  # `import` of it now fails
    compat.inductor_templates.cache_clear()
    with pytest.raises(gi.InductorUnavailable, match="no Inductor lookup table"):
        gi.install()
    assert not gi.available()
    assert main(["inductor-table", "--out", "x.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Inductor lookup table" in err[0]


def test_an_addmm_pick_also_answers_its_unfused_mm():
    x, w, b = torch.randn(16, 8), torch.randn(12, 8), torch.randn(12)
    sel = gemmtune.tune("addmm", b, x, w.t(), backends=("extern",))
    table = gi.table_for([sel])
    mm_key = gi.problem_keys(KernelInputs.from_tensors("mm", x, w.t()))[0]
    assert table[mm_key] == [{"template_id": "aten::mm"}]
    mm_sel = gemmtune.tune("mm", x, w.t(), backends=("extern",))
    assert gi.table_for([sel, mm_sel])[mm_key] == [{"template_id": "aten::mm"}]


def test_an_early_lookup_table_without_the_hooks_used_is_a_typed_error(monkeypatch):
    from torch._inductor.lookup_table import LookupTableChoices

    monkeypatch.delattr(LookupTableChoices, "_fallback")
    with pytest.raises(gi.InductorUnavailable, match="_fallback"):
        gi.require()


def test_an_mm_whose_call_can_build_nothing_of_the_pick_gets_inductors_list(monkeypatch):
    """mm and bmm have one call: when neither the pick nor the library kernel is offered there (mm with
    out_dtype offers aten::mm_dtype), Inductor keeps its own list rather than getting no choice; an
    addmm call that builds nothing is fine while its library call happens."""
    class T:
        def __init__(self, uid, src_hash=None):
            self.uid, self.src_hash = uid, src_hash

    handler = gi.install(tune_on_miss=False)
    monkeypatch.setattr(handler, "make_lookup_key", lambda *a, **k: "k")
    monkeypatch.setattr(handler, "_fallback", lambda *a, **k: ["inductor's own list"])
    handler.picks["k"] = gi.InductorPick("mm", ("k",), ({"template_id": "aten::mm"},), True, "t")
    assert handler._finalize_template_configs({}, None, [T("aten::mm_dtype")], "mm") == ["inductor's own list"]
    assert handler.stats["fallback"] == 1
    handler.picks["k"] = gi.InductorPick("addmm", ("k",), ({"template_id": "aten::addmm"},), True, "t")
    assert handler._finalize_template_configs({}, None, [T("triton::mm", "h")], "addmm") == []
    assert handler.stats["empty"] == 1


def test_cli_from_a_suite_file(tmp_path, capsys):
    suite = tmp_path / "suite.json"
    suite.write_text('{"shapes": [{"name": "a", "op": "addmm", "M": 16, "K": 8, "N": 12, "b_layout": "col"},'
                     ' {"name": "b", "M": 4, "K": 8, "N": 4}]}')
    path = tmp_path / "t.json"
    assert main(["inductor-table", "--out", str(path), "--suite", str(suite), "--device", "cpu"]) == 0
    assert "for 2 problems (2 exact picks)" in capsys.readouterr().out
    table = gi.read_table(path)
    assert {k.rsplit("+", 1)[-1] for k in table} == {"addmm", "mm"}
    assert main(["inductor-table", "--out", str(path), "--suite", str(tmp_path / "none.json")]) == 2


def test_a_cpu_max_autotune_compile_hands_inductor_the_pick_alone_for_bmm():
    """Inductor adds its C++ micro-GEMM to a CPU bmm (and to a mm of frozen weights) itself, past the choices
    handler: under an installed handler it was benchmarked against the pick.  It is not offered now."""
    from torch._dynamo.utils import counters
    from torch._inductor import config

    a, b = torch.randn(4, 32, 48), torch.randn(4, 48, 16)
    handler = gi.install(settings=gemmtune.Settings(store="memory", backends=("extern",)), fusion=0)
    counters["inductor"].clear()
    with config.patch(max_autotune=True):
        out = torch.compile(lambda x, y: torch.bmm(x, y) * 2)(a, b)
    torch.testing.assert_close(out, torch.bmm(a, b) * 2)
    assert handler.stats["tuned"] + handler.stats["store_hit"] >= 1  # gemmtune picked
    assert counters["inductor"]["select_algorithm_autotune"] == 0  # and Inductor benchmarked nothing
