"""Lookup-table pins, `gemmtune cache import` files and Inductor tables that can never match a candidate:
each is a warning naming the entry when loaded (an error with exit 2 for `cache import`), never ignored."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import gemmtune
from gemmtune.core.errors import LookupTableError
from gemmtune.store.lookup import LookupTable

KEY = "mm(64x32, 32x80)/float32/0123456789abcdef"
NUMBA = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32}  # one of numba_mm's fitted tiles for 64x32x80

USELESS_PINS = {
    "another_ops_template": ({KEY: [{"template": "aten_bmm"}]}, "a template of bmm, not of mm"),
    "addmm_template_on_mm": ({KEY: [{"template": "aten_addmm"}]}, "a template of addmm, not of mm"),
    "string_config_values": ({KEY: [{"template": "numba_mm", "src_hash": None,
                                     "config": {"BLOCK_M": "64", "BLOCK_N": "128", "BLOCK_K": "32"}}]},
                             "config values must be integers"),
    "config_not_a_candidate": ({KEY: [{"template": "numba_mm", "config": {**NUMBA, "BLOCK_M": 7}}]},
                               "is not one of its candidates for this problem"),
    "empty_pin_list": ({KEY: []}, f"key {KEY!r} has no pins"),
    "key_matching_no_problem": ({"mm 64x32x80": [{"template": "aten_mm"}]}, "is not a problem key"),
    "unknown_template": ({KEY: [{"template": "cublas_mm"}]}, "names unknown template 'cublas_mm'"),
}


@pytest.mark.parametrize("case", sorted(USELESS_PINS))
def test_a_pin_that_can_never_match_warns_naming_the_entry(case):
    table, problem = USELESS_PINS[case]
    with pytest.warns(RuntimeWarning, match="will never match a candidate") as record:
        loaded = LookupTable.load(table)
    assert any(problem in str(w.message) for w in record), [str(w.message) for w in record]
    assert any(repr(next(iter(table))) in str(w.message) for w in record)
    assert loaded.unknown


def test_real_pins_exported_from_a_tune_load_without_a_warning(tmp_path):
    store = tmp_path / "s.db"
    a, b = torch.randn(64, 32), torch.randn(32, 80)
    settings = gemmtune.Settings(store=str(store), cpu_configs=1, effort="quick")
    gemmtune.tune("mm", a, b, settings=settings)
    gemmtune.tune("addmm", torch.randn(80), a, b, settings=settings.with_(backends="extern"))
    from gemmtune.store.sqlite import Store

    data = Store(store).export()
    assert {e["pick"]["template"] for e in data["entries"]} and len(data["entries"]) == 2
    data["entries"][0]["pick"] = {"template": "numba_mm", "src_hash": None, "config": NUMBA, "runtime_params": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(LookupTable.load(data)) == 2
        assert len(LookupTable.load({e["problem"]: [e["pick"]] for e in data["entries"]})) == 2


def _export(pick: dict) -> dict:
    env = {"device": "cpu", "torch": torch.__version__}
    return {"format": "gemmtune-store/1", "entries": [{"problem": KEY, "env": env, "pick": pick,
                                                        "timings": [{**pick, "status": "ok"}]}]}


@pytest.mark.parametrize("pick,problem", [
    ({"template": "no_such_kernel", "config": {}, "runtime_params": {}}, "names unknown template 'no_such_kernel'"),
    ({"template": "numba_mm", "config": {**NUMBA, "BLOCK_M": 3}, "runtime_params": {}}, "is not one of its candidates"),
    ({"template": "aten_mm", "config": {"BLOCK_M": 64}, "runtime_params": {}}, "a library kernel has no config"),
    ({"template": "aten_mm", "config": {}, "runtime_params": {"group": 4}}, "no runtime parameter 'group'"),
])
def test_cache_import_of_a_pick_that_cannot_run_exits_2_and_stores_nothing(tmp_path, capsys, pick, problem):
    from gemmtune.cli import main
    from gemmtune.store.sqlite import Store

    path = tmp_path / "picks.json"
    path.write_text(json.dumps(_export({"src_hash": None, "ms": 1.0, **pick})))
    store = tmp_path / "s.db"
    assert main(["cache", "--store", str(store), "import", str(path)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gemmtune: error: cache import {path}: ") and problem in lines[0]
    assert "imported" not in out
    assert Store(store).problems() == []


def test_inductor_drop_stale_refuses_what_is_not_a_table_and_warns_on_unknown_templates():
    gi = pytest.importorskip("gemmtune.inductor")
    if not gi.available():
        pytest.skip("this torch has no Inductor lookup table")
    for bad in ([1, 2], {"k+mm": "aten::mm"}, {"k+mm": [{"template": "aten::mm"}]}, 3):
        with pytest.raises(LookupTableError):
            gi.drop_stale(bad)
    with pytest.warns(RuntimeWarning, match="key 'k\\+mm': template_id 'cublas::mm' is not one of"):
        kept = gi.drop_stale({"k+mm": [{"template_id": "cublas::mm"}]})
    assert kept == {"k+mm": [{"template_id": "cublas::mm"}]}
    with pytest.warns(RuntimeWarning, match="key 'j\\+mm' has no entries"):
        gi.drop_stale({"j+mm": []})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gi.drop_stale({"k+mm": [{"template_id": "aten::mm"}]}) == {"k+mm": [{"template_id": "aten::mm"}]}
