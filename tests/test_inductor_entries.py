"""The lookup-table entries gemmtune builds for Inductor (`gemmtune.inductor.entries_for`): Triton picks
mapped to Inductor's templates under torch's own source hashes, the closest few where a pick has no
counterpart, library picks with their Triton companions, and stale entries dropped with a warning, by
`drop_stale`, by the handler and by `install(table=...)`.  On CPU with the installed torch."""

from __future__ import annotations

import pytest
import torch

import gemmtune
import gemmtune.inductor as gi
from gemmtune.core.choices import Choice, as_params
from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.inductor.entries import Measured

from helpers import fresh_inductor  # noqa: F401 - the fixture

pytestmark = [pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table"),
              pytest.mark.usefixtures("fresh_inductor")]


def cuda_problem(op="mm", M=128, K=4096, N=256):
    meta = lambda size, stride: TensorMeta(size, stride, torch.bfloat16, "cuda:0")  # noqa: E731
    if op == "addmm":
        return KernelInputs(op, (meta((N,), (1,)), meta((M, K), (K, 1)), meta((K, N), (N, 1))))
    if op == "bmm":
        return KernelInputs("bmm", (meta((4, M, K), (M * K, K, 1)), meta((4, K, N), (K * N, N, 1))))
    return KernelInputs(op, (meta((M, K), (K, 1)), meta((K, N), (N, 1))))


def choice(uid, config, runtime=(), src_hash="h"):
    return Choice(uid, src_hash, as_params(dict(config)), as_params(dict(runtime)))


TILE = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_stages=4, num_warps=8)


ACC = dict(ACC_TYPE="tl.float32", USE_FAST_ACCUM=False)  # complete for torch versions that do not merge


def test_triton_picks_map_to_inductor_templates_with_torch_hashes():
    from torch._inductor.kernel.bmm import bmm_template
    from torch._inductor.kernel.mm import mm_template, persistent_tma_mm_template

    e = gi.entries_for(cuda_problem(), choice("triton_mm", TILE, {"swizzle": 4}))
    assert e.exact and e.entries == ({"template_id": "triton::mm", "template_hash": mm_template.src_hash, **TILE,
                                      "GROUP_M": 4, "EVEN_K": True, **ACC},)
    odd = gi.entries_for(cuda_problem(K=4000), choice("triton_mm", TILE, {"swizzle": 8})).entries[0]
    assert odd["EVEN_K"] is False  # 4000 % 64
    tma = gi.entries_for(cuda_problem(), choice("triton_tma_persistent", {**TILE, "EPILOGUE_SUBTILE": 1}))
    assert tma.entries[0]["template_id"] == "triton::mm_persistent_tma" and "EPILOGUE_SUBTILE" not in tma.entries[0]
    assert tma.entries[0]["template_hash"] == persistent_tma_mm_template.src_hash
    b = gi.entries_for(cuda_problem("bmm"), choice("triton_mm", TILE))
    assert b.entries[0]["template_id"] == "triton::bmm" and b.entries[0]["template_hash"] == bmm_template.src_hash


def test_picks_without_a_counterpart_export_the_closest_few_and_aten():
    measured = [Measured("triton_mm", dict(TILE, BLOCK_M=m), {"swizzle": 8}, ms) for m, ms in ((16, 0.2), (32, 0.1), (64, 0.3))]
    split = gi.entries_for(cuda_problem(M=16), choice("triton_splitk", dict(TILE, SPLIT_K=4)), measured)
    assert not split.exact
    assert [e["template_id"] for e in split.entries] == ["decompose_k", "triton::mm", "triton::mm", "aten::mm"]
    assert split.entries[0]["k_split"] == 4 and [e.get("BLOCK_M") for e in split.entries[1:3]] == [32, 16]
    gemv = gi.entries_for(cuda_problem(M=1), choice("triton_gemv", dict(BLOCK_N=64, BLOCK_K=128, num_warps=4)))
    assert [e["template_id"] for e in gemv.entries] == ["triton::mm", "aten::mm"]
    assert gemv.entries[0]["BLOCK_M"] == 16 and gemv.entries[0]["BLOCK_K"] == 128
    lib = gi.entries_for(cuda_problem("bmm"), choice("aten_bmm", {}, src_hash=None))
    assert lib.exact and lib.entries == ({"template_id": "aten::bmm"},)


def test_a_stale_template_hash_is_dropped_with_a_warning():
    from torch._inductor.kernel.mm import mm_template
    from torch._inductor.lookup_table import LookupTableChoices

    fresh = gi.entries_for(cuda_problem(), choice("triton_mm", TILE)).json_entries()[0]
    stale = dict(fresh, template_hash="0" * 64)
    hashes = {mm_template.uid: mm_template.src_hash}
    assert LookupTableChoices._entry_is_valid(fresh, mm_template.uid, hashes)  # torch keeps ours
    assert not LookupTableChoices._entry_is_valid(stale, mm_template.uid, hashes)  # and drops a stale one
    with pytest.warns(RuntimeWarning, match="entry dropped"):
        kept = gi.drop_stale({"k+mm": [stale, {"template_id": "aten::mm"}], "j+mm": [stale]})
    assert kept == {"k+mm": [{"template_id": "aten::mm"}]}


def test_the_handler_drops_a_stale_entry_with_a_warning_and_stands_in_the_library_kernel():
    class T:  # the two attributes Inductor's templates show the handler
        def __init__(self, uid, src_hash):
            self.uid, self.src_hash = uid, src_hash

    handler = gi.install(tune_on_miss=False)
    pick = gi.InductorPick("mm", ("k",), ({"template_id": "triton::mm", "template_hash": "old", **TILE},), True, "t")
    with pytest.warns(RuntimeWarning, match="entry dropped"):
        chosen = handler._choose(pick, [T("aten::mm", None), T("triton::mm", "new")], None, "mm")
    assert chosen == {"aten::mm": [{}]} and handler.stats["stale"] == 1


def test_a_pick_its_call_cannot_build_gets_a_stand_in():
    class T:
        def __init__(self, uid, src_hash=None):
            self.uid, self.src_hash = uid, src_hash

    from torch._inductor.kernel.mm import mm_template

    handler = gi.install(tune_on_miss=False)
    tma = gi.entries_for(cuda_problem(), choice("triton_tma_persistent", {**TILE, "EPILOGUE_SUBTILE": 0}))
    chosen = handler._choose(tma, [T("aten::mm"), T("triton::mm", mm_template.src_hash)], None, "mm")
    assert chosen == {"triton::mm": [{**TILE, "GROUP_M": 8, "EVEN_K": True, **ACC}]}  # TMA not offered: its tile
    assert handler._choose(tma, [T("aten::mm")], None, "mm") == {"aten::mm": [{}]}  # no Triton: the library
    lib = gi.entries_for(cuda_problem("addmm"), choice("aten_addmm", {}, src_hash=None))
    assert handler._choose(lib, [T("triton::mm", mm_template.src_hash)], None, "addmm") == {}  # built elsewhere


def test_a_library_pick_brings_its_best_triton_configs_for_inductor_to_benchmark_under_max_autotune():
    class T:
        def __init__(self, uid, src_hash=None):
            self.uid, self.src_hash = uid, src_hash

    from torch._inductor.kernel.mm import mm_template

    near = [Measured("aten_mm", {}, {}, 0.010), Measured("triton_mm", TILE, {"swizzle": 4}, 0.012),
            Measured("triton_mm", dict(TILE, BLOCK_M=16), {"swizzle": 8}, 0.025)]
    lib = gi.entries_for(cuda_problem(M=16), choice("aten_mm", {}, src_hash=None), near)
    companion = {"template_id": "triton::mm", "template_hash": mm_template.src_hash, **TILE, "GROUP_M": 4,
                 "EVEN_K": True, **ACC}
    assert lib.exact and lib.entries == ({"template_id": "aten::mm"},) and lib.companions == (companion,)
    assert lib.json_entries() == [{"template_id": "aten::mm"}, companion]  # a written table offers both
    far = [near[0], Measured("triton_mm", TILE, {"swizzle": 4}, 0.014)]  # 1.4x the library: no companion
    assert gi.entries_for(cuda_problem(M=16), choice("aten_mm", {}, src_hash=None), far).companions == ()
    assert gi.entries_for(cuda_problem(M=16), choice("aten_mm", {}, src_hash=None), near, fusion=0).companions == ()
    two = gi.entries_for(cuda_problem(M=16), choice("aten_mm", {}, src_hash=None), near + [
        Measured("triton_mm", dict(TILE, BLOCK_N=64), {"swizzle": 8}, 0.0125)], fusion=2).companions
    assert [e["BLOCK_N"] for e in two] == [128, 64]  # the best two within 1.3x, fastest first
    triton = gi.entries_for(cuda_problem(M=16), choice("triton_mm", TILE, {"swizzle": 4}), near)
    assert triton.companions == ()  # a Triton pick fuses its epilogue itself

    offered = [T("aten::mm"), T("triton::mm", mm_template.src_hash)]
    from torch._inductor import config

    handler = gi.install(tune_on_miss=False, fusion=2)
    kwargs = {k: v for k, v in companion.items() if k not in ("template_id", "template_hash")}
    add = gi.entries_for(cuda_problem("addmm", M=16), choice("aten_addmm", {}, src_hash=None),
                         [Measured("aten_addmm", {}, {}, 0.010), near[1]])
    # (config.patch, not monkeypatch: undoing monkeypatch.setattr deletes an Inductor config attribute)
    with config.patch(max_autotune=True):  # a max-autotune compile: the companions are benchmarked
        assert handler._choose(lib, offered, None, "mm") == {"aten::mm": [{}], "triton::mm": [kwargs]}
        assert handler.stats["companion"] == 1
        assert handler._choose(add, [T("triton::mm", mm_template.src_hash)], None, "addmm") == {"triton::mm": [kwargs]}
    gi.uninstall()
    alone = gi.install(tune_on_miss=False, fusion=False)
    assert alone._choose(lib, offered, None, "mm") == {"aten::mm": [{}]}
    assert alone.uuid() != handler.uuid()  # a graph compiled with companions is not served to one without


def test_install_from_a_json_file_drops_its_stale_entries(tmp_path):
    fresh = gi.entries_for(cuda_problem(), choice("triton_mm", TILE)).json_entries()[0]
    path = tmp_path / "table.json"
    gi.write_table({"a+mm": [dict(fresh, template_hash="f" * 64)], "b+mm": [fresh]}, path)
    with pytest.warns(RuntimeWarning, match="entry dropped"):
        handler = gi.install(table=path, tune_on_miss=False)
    assert set(handler.picks) == {"b+mm"} and handler.picks["b+mm"].exact
    (tmp_path / "bad.json").write_text('{"k+mm": [{"no_template_id": 1}]}')
    with pytest.raises(gemmtune.core.errors.LookupTableError, match="template_id"):
        gi.install(table=tmp_path / "bad.json")
