"""The shortlist of Inductor's configs a problem new to the store is timed on (inductor/shortlist.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gemmtune.core.inputs import KernelInputs, TensorMeta
from gemmtune.inductor.shortlist import shortlist, shortlist_choices
from gemmtune.search.cost_model import estimate_ms


def _ki(m: int, n: int, k: int) -> KernelInputs:
    return KernelInputs("mm", (TensorMeta((m, k), (k, 1), torch.bfloat16, "cuda"),
                               TensorMeta((k, n), (n, 1), torch.bfloat16, "cuda")))


def _tile(bm: int, bn: int, bk: int, stages: int = 3, warps: int = 4, **extra) -> dict:
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps, GROUP_M=8, **extra)


TILES = [_tile(16, 16, 16, 1, 2), _tile(32, 32, 32), _tile(64, 64, 64), _tile(128, 128, 64, 4, 8),
         _tile(128, 256, 64, 3, 8), _tile(64, 128, 128, 5, 4), _tile(256, 128, 64, 3, 8), _tile(64, 32, 128, 5, 4)]


@pytest.mark.parametrize("mnk", [(64, 4096, 1024), (512, 14336, 4096), (4096, 4096, 4096)])
@pytest.mark.parametrize("top", [1, 3, 5])
def test_keeps_the_best_modelled_tiles_of_each_template_and_every_library_kernel(mnk, top):
    ki = _ki(*mnk)
    cands = [("aten::mm", None)] + [("triton::mm", t) for t in TILES] + [("triton::tma", t) for t in TILES[:4]]
    keep = shortlist(cands, ki, top)
    assert keep == sorted(keep) and 0 in keep
    for uid, tiles in (("triton::mm", TILES), ("triton::tma", TILES[:4])):
        kept = [cands[i][1] for i in keep if cands[i][0] == uid]
        assert len(kept) == min(top, len(tiles))
        worst_kept = max(estimate_ms(t, *mnk) for t in kept)
        dropped = [t for t in tiles if t not in kept]
        assert all(estimate_ms(t, *mnk) >= worst_kept for t in dropped)


def test_candidates_the_model_cannot_read_are_kept():
    cands = [("triton::mm", t) for t in TILES] + [("triton::decompose_k", {"k_split": 4}),
                                                  ("triton::mm", None), ("triton::mm", _tile(64, 64, 64, warps=True))]
    keep = shortlist(cands, _ki(64, 4096, 1024), 2)
    assert {8, 9, 10} <= set(keep) and len(keep) == 5


def test_none_keeps_everything_and_a_bad_top_is_refused():
    cands = [("triton::mm", t) for t in TILES]
    assert shortlist(cands, _ki(64, 64, 64), None) == list(range(len(TILES)))
    with pytest.raises(ValueError, match="top must be >= 1"):
        shortlist(cands, _ki(64, 64, 64), 0)


def _ktc(uid: str, options: dict | None) -> SimpleNamespace:
    def to_kwargs():
        if options is None:
            raise RuntimeError("no options")
        return options
    return SimpleNamespace(template=SimpleNamespace(uid=uid), params=SimpleNamespace(to_kwargs=to_kwargs))


def test_shortlist_choices_cuts_inductors_choices_in_order():
    ktcs = [_ktc("aten::mm", {})] + [_ktc("triton::mm", t) for t in TILES] + [_ktc("triton::mm", None)]
    kept = shortlist_choices(ktcs, _ki(512, 14336, 4096), 2, torch.device("cpu"))
    assert kept[0] is ktcs[0] and kept[-1] is ktcs[-1] and len(kept) == 4
    assert [ktcs.index(k) for k in kept] == sorted(ktcs.index(k) for k in kept)
    assert shortlist_choices(ktcs, None, 2, torch.device("cpu")) == ktcs  # symbolic sizes: all


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "6"])
def test_install_refuses_a_bad_shortlist(bad):
    import gemmtune.inductor as gi
    from gemmtune.inductor.compat import available

    if not available():
        pytest.skip("this torch has no Inductor lookup table")
    with pytest.raises(ValueError, match="shortlist"):
        gi.install(shortlist=bad)
