"""Every batch size: M buckets (gemmtune.dispatch.buckets), tuning a family over a range of M
(`gemmtune.tune_buckets`, `gemmtune.warmup(..., m=...)`), and eager calls at any M that tune nothing.
Real kernels on CPU: torch's ops, and a Triton kernel through the interpreter."""

from __future__ import annotations

import pytest
import torch

import gemmtune
from gemmtune.core.errors import InputError
from gemmtune.dispatch.buckets import BUCKETS, bucket_of, buckets_for, family_of, parse_m

EXTERN = ("extern",)


@pytest.fixture(autouse=True)
def _fresh_dispatch():
    gemmtune.clear_dispatch_cache()
    yield
    gemmtune.clear_dispatch_cache()


def test_buckets_are_powers_of_two_and_a_range_covers_its_ends():
    assert [bucket_of(m) for m in (1, 2, 3, 4, 5, 1000, 1024, 1025)] == [1, 2, 4, 4, 8, 1024, 1024, 2048]
    assert buckets_for([3, 100]) == [4, 8, 16, 32, 64, 128]
    assert parse_m(range(1, 4097)) == [1, 4096] and parse_m("512:4096") == [512, 4096] and parse_m((7,)) == [7]


@pytest.mark.parametrize("bad", ["1-4096", "9:3", "0:8", [1.5, 3], range(0), [], None, "1:99999999"])
def test_a_bad_range_is_a_typed_error_that_names_it(bad):
    with pytest.raises(InputError, match="^m: "):
        parse_m(bad)


def test_a_family_leaves_m_out_and_keeps_everything_else():
    w = torch.randn(8, 16)
    fam = lambda a, b=w.t(), op="mm", *bias: family_of(op, (*bias, a, b), 1.0, 1.0, None, None)  # noqa: E731
    assert fam(torch.randn(3, 16)) == fam(torch.randn(300, 16)) is not None
    assert fam(torch.randn(16, 3).t()) != fam(torch.randn(3, 16))  # column-major A: another family
    assert fam(torch.randn(3, 16), torch.randn(16, 8)) != fam(torch.randn(3, 16))  # B's layout is the family's
    assert family_of("addmm", (torch.randn(8), torch.randn(3, 16), w.t()), 1.0, 1.0, None, None) is not None
    assert family_of("addmm", (torch.randn(3, 8), torch.randn(3, 16), w.t()), 1.0, 1.0, None, None) is None
    assert family_of("bmm", (torch.randn(2, 3, 16), torch.randn(2, 16, 8)), 1.0, 1.0, None, None) is None


def test_after_a_range_tune_no_m_in_the_range_tunes_and_every_result_is_right():
    w = torch.randn(24, 16)
    picks = gemmtune.tune_buckets("mm", torch.randn(5, 16), w.t(), m=range(1, 65), backends=EXTERN)
    assert sorted(picks) == [1, 2, 4, 8, 16, 32, 64]
    tunes = gemmtune.dispatch_stats()["tunes"]
    for m in (3, 17, 50, 64, 1):
        a = torch.randn(m, 16)
        torch.testing.assert_close(gemmtune.mm(a, w.t(), backends=EXTERN), a @ w.t())
    stats = gemmtune.dispatch_stats()
    assert stats["tunes"] == tunes and stats["bucket_builds"] == 3 and stats["outside_buckets"] == 0


def test_an_m_outside_the_range_takes_the_nearest_bucket_and_is_counted():
    w = torch.randn(24, 16)
    gemmtune.tune_buckets("addmm", torch.randn(24), torch.randn(5, 16), w.t(), m="8:32", backends=EXTERN)
    tunes = gemmtune.dispatch_stats()["tunes"]
    for m in (200, 2):
        bias, a = torch.randn(24), torch.randn(m, 16)
        torch.testing.assert_close(gemmtune.addmm(bias, a, w.t(), backends=EXTERN), torch.addmm(bias, a, w.t()))
    stats = gemmtune.dispatch_stats()
    assert stats["tunes"] == tunes and stats["outside_buckets"] == 2


def test_a_bucket_met_outside_the_range_is_marked_and_tuned_later_off_the_hot_path():
    w = torch.randn(24, 16)
    gemmtune.tune_buckets("addmm", torch.randn(24), torch.randn(5, 16), w.t(), m="8:32", backends=EXTERN)
    family = family_of("addmm", (torch.randn(24), torch.randn(200, 16), w.t()), 1.0, 1.0, EXTERN, None)
    tunes = gemmtune.dispatch_stats()["tunes"]
    for m in (200, 200, 2, 250):  # buckets 256 (twice, then a hit), 2, 256 again
        bias, a = torch.randn(24), torch.randn(m, 16)
        torch.testing.assert_close(gemmtune.addmm(bias, a, w.t(), backends=EXTERN), torch.addmm(bias, a, w.t()))
    stats = gemmtune.dispatch_stats()
    assert stats["tunes"] == tunes and stats["outside_buckets"] == 3 and stats["buckets_wanted"] == 2
    a_meta = BUCKETS.examples[family][1][1]
    assert BUCKETS.wanted[family] == {2, 256} and (a_meta.size, a_meta.stride) == ((8, 16), (16, 1))
    assert gemmtune.tune_wanted_buckets() == {2: 1, 256: 1}
    assert gemmtune.dispatch_stats()["tunes"] == tunes + 2  # tuned, not the nearest bucket's pick again
    assert gemmtune.dispatch_stats()["buckets_wanted"] == 0 and {2, 256} <= set(BUCKETS.families[family])
    assert gemmtune.tune_wanted_buckets() == {}  # nothing left to tune
    tunes, bias, a = gemmtune.dispatch_stats()["tunes"], torch.randn(24), torch.randn(130, 16)
    torch.testing.assert_close(gemmtune.addmm(bias, a, w.t(), backends=EXTERN), torch.addmm(bias, a, w.t()))
    stats = gemmtune.dispatch_stats()  # M = 130: bucket 256, tuned now, so neither outside nor a tune
    assert stats["outside_buckets"] == 3 and stats["tunes"] == tunes and stats["buckets_wanted"] == 0


def test_a_wanted_bucket_is_tuned_in_its_familys_layout_from_stand_ins_and_alone(monkeypatch):
    import gc
    import weakref

    from gemmtune import engine
    from gemmtune.dispatch import ranges

    w = torch.randn(24, 16)
    weight = weakref.ref(w)
    bias = torch.randn(24).expand(5, 24)  # a bias broadcast over M, stride 0
    gemmtune.tune_buckets("addmm", bias, torch.randn(16, 5).t(), w.t(), m="2:8", backends=EXTERN)  # A col-major
    gemmtune.addmm(torch.randn(24).expand(40, 24), torch.randn(16, 40).t(), w.t(), backends=EXTERN)
    seen = []
    real = engine.tune
    monkeypatch.setattr(engine, "tune", lambda op, *t, **kw: seen.append(
        ([x.stride() for x in t], kw["settings"].distributed)) or real(op, *t, **kw))
    del w
    gc.collect()
    assert weight() is None  # the family's example keeps sizes and strides, not the weight
    assert gemmtune.tune_wanted_buckets() == {64: 1}
    assert seen == [([(0, 1), (1, 64), (1, 16)], "off")]  # bias broadcast, A column-major; no other rank


def test_a_range_tune_stands_aside_only_in_its_own_thread():
    import threading

    from gemmtune.dispatch.buckets import BUCKETS as table

    w = torch.randn(24, 16)
    gemmtune.tune_buckets("mm", torch.randn(5, 16), w.t(), m="8:32", backends=EXTERN)
    before = gemmtune.dispatch_stats()
    with table.tuning():  # this thread tunes a range: another thread's call still takes its bucket's pick
        t = threading.Thread(target=lambda: gemmtune.mm(torch.randn(20, 16), w.t(), backends=EXTERN))
        t.start()
        t.join()
    after = gemmtune.dispatch_stats()
    assert after["tunes"] == before["tunes"] and after["bucket_builds"] == before["bucket_builds"] + 1


def test_a_bucket_met_before_its_range_was_tuned_is_tuned_afresh_and_a_clear_drops_a_late_tune(monkeypatch):
    from gemmtune.dispatch import ranges

    w = torch.randn(24, 16)
    gemmtune.tune_buckets("mm", torch.randn(5, 16), w.t(), m="8:32", backends=EXTERN)
    gemmtune.mm(torch.randn(64, 16), w.t(), backends=EXTERN)  # bucket 64 met outside: bucket 32's pick, pinned
    family = family_of("mm", (torch.randn(64, 16), w.t()), 1.0, 1.0, EXTERN, None)
    pinned, tunes = set(BUCKETS.wanted[family]), gemmtune.dispatch_stats()["tunes"]
    gemmtune.tune_buckets("mm", torch.randn(5, 16), w.t(), m="8:64", backends=EXTERN)
    assert pinned == {64} and gemmtune.dispatch_stats()["tunes"] == tunes + 1  # bucket 64 tuned, not pinned
    assert not BUCKETS.is_pinned(BUCKETS.families[family][64]) and not BUCKETS.wanted[family]
    gemmtune.mm(torch.randn(100, 16), w.t(), backends=EXTERN)  # bucket 128 wanted
    real = ranges._tune_afresh
    monkeypatch.setattr(ranges, "_tune_afresh", lambda *a: (gemmtune.clear_dispatch_cache(), real(*a))[1])
    assert gemmtune.tune_wanted_buckets() == {128: 1}
    assert BUCKETS.families == {}  # cleared while it tuned: nothing registered for a family that is gone


def test_a_wider_range_tunes_its_new_buckets_of_a_family_already_registered():
    w = torch.randn(24, 16)
    gemmtune.tune_buckets("mm", torch.randn(5, 16), w.t(), m="8:32", backends=EXTERN)
    tunes, builds = gemmtune.dispatch_stats()["tunes"], gemmtune.dispatch_stats()["bucket_builds"]
    gemmtune.tune_buckets("mm", torch.randn(5, 16), w.t(), m="2:128", backends=EXTERN)
    stats = gemmtune.dispatch_stats()  # 2, 4, 64 and 128 tuned (8-32 were dispatched already)
    assert stats["tunes"] == tunes + 4 and stats["bucket_builds"] == builds and stats["outside_buckets"] == 0


def test_a_family_nobody_tuned_over_m_is_tuned_per_m_as_before():
    w = torch.randn(24, 16)
    gemmtune.mm(torch.randn(5, 16), w.t(), backends=EXTERN)
    gemmtune.mm(torch.randn(6, 16), w.t(), backends=EXTERN)
    stats = gemmtune.dispatch_stats()
    assert stats["tunes"] == 2 and stats["bucket_builds"] == 0 and stats["bucket_families"] == 0


def test_a_range_warm_up_serves_every_batch_size_of_the_model_without_a_tune():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    reference = [p.detach().clone() for p in model.parameters()]
    report = gemmtune.warmup(model, torch.randn(4, 16), backends=EXTERN, progress=False, m=range(1, 129))
    assert len(report.rows) == 2 + 2 * 7  # the forward's two problems, then each family at 8 buckets less M = 4
    tunes = gemmtune.dispatch_stats()["tunes"]
    plain = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    with torch.no_grad():
        for p, r in zip(plain.parameters(), reference):
            p.copy_(r)
        for batch in (1, 3, 33, 100, 128):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(model(x), plain(x))
    assert gemmtune.dispatch_stats()["tunes"] == tunes and gemmtune.dispatch_stats()["bucket_families"] == 2
    with pytest.raises(InputError, match="m= decides eager calls"):
        gemmtune.warmup(model, torch.randn(4, 16), backends=EXTERN, progress=False, m=[8], for_compile=True)


def test_a_generated_bucket_pick_runs_at_another_m_as_the_same_kernel():
    w = torch.randn(16, 16)
    settings = gemmtune.Settings(effort="quick", store="off")
    sel = gemmtune.tune("mm", torch.randn(32, 16), w.t(), backends=("triton",), settings=settings, progress=False)
    fam = family_of("mm", (torch.randn(32, 16), w.t()), 1.0, 1.0, ("triton",), None)
    BUCKETS.register(fam, 32, sel)
    a = torch.randn(20, 16)
    torch.testing.assert_close(gemmtune.mm(a, w.t(), backends=("triton",)), a @ w.t(), rtol=1e-3, atol=1e-3)
    (built,) = [s for s in gemmtune.dispatch.eager.selections().values() if s.problem.M == 20]
    assert built.winner.key == sel.winner.key and gemmtune.dispatch_stats()["tunes"] == 0


@pytest.mark.parametrize("bias_shape", [(), (24,), (1, 24), "broadcast"])
def test_every_bias_that_does_not_depend_on_m_keeps_a_family(bias_shape):
    w = torch.randn(24, 16)
    bias = lambda m: (torch.randn(1, 24).expand(m, 24) if bias_shape == "broadcast"  # noqa: E731
                      else torch.randn(bias_shape))
    gemmtune.tune_buckets("addmm", bias(5), torch.randn(5, 16), w.t(), m=[4, 16], backends=EXTERN)
    tunes = gemmtune.dispatch_stats()["tunes"]
    b, a = bias(11), torch.randn(11, 16)
    torch.testing.assert_close(gemmtune.addmm(b, a, w.t(), backends=EXTERN), torch.addmm(b, a, w.t()))
    assert gemmtune.dispatch_stats()["tunes"] == tunes


def test_the_cli_tunes_a_shape_at_every_bucket_and_refuses_a_bad_range(tmp_path, capsys):
    import json

    from gemmtune.cli import main

    out = tmp_path / "buckets.json"
    assert main(["tune", "--shape", "3x16x8", "--device", "cpu", "--backends", "extern", "--m", "3:16",
                 "--store", "off", "--no-progress", "--json", str(out)]) == 0
    assert [r["problem"]["M"] for r in json.loads(out.read_text())["results"]] == [4, 8, 16]
    assert main(["tune", "--shape", "3x16x8", "--device", "cpu", "--m", "16:3"]) == 2
    assert "argument --m: LO is above HI" in capsys.readouterr().err


def test_a_layer_with_a_generated_pick_in_some_bucket_is_not_released():
    import types

    from gemmtune.core.choices import Choice
    from gemmtune.dispatch.ranges import generated_somewhere
    from gemmtune.dispatch.release import release_library_layers

    model = gemmtune.patch(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)), backends=EXTERN)
    x = torch.randn(3, 16)
    model(x)  # both layers decided for torch's op at M = 3
    first = model[0]
    fam = family_of("addmm", (first.bias, x, first.weight.t()), 1.0, 1.0, EXTERN, None)
    BUCKETS.register(fam, 64, types.SimpleNamespace(winner=Choice("aten_addmm", None)))
    assert not generated_somewhere(first, x)
    BUCKETS.register(fam, 128, types.SimpleNamespace(winner=Choice("triton_mm", "h", family="triton")))
    assert generated_somewhere(first, x) and not generated_somewhere(model[1], first(x))
    assert release_library_layers(model, lambda: model(x), keep=generated_somewhere) == ["1"]


def test_cache_ls_shows_the_families_stored_at_several_m(tmp_path, capsys):
    from gemmtune.cli import main

    where = str(tmp_path / "picks.db")
    assert main(["tune", "--shape", "3x16x8", "--device", "cpu", "--backends", "extern", "--m", "1:4",
                 "--store", where, "--no-progress"]) == 0
    assert main(["tune", "--shape", "5x32x8", "--device", "cpu", "--backends", "extern", "--store", where,
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["cache", "ls", "--store", where]) == 0
    shown = capsys.readouterr().out
    assert "mm(Mx16, 16x8) float32 out=row" in shown and "1, 2, 4" in shown and "Mx32" not in shown


def test_a_bad_range_is_refused_before_the_warm_up_runs_the_model():
    calls = []
    model = torch.nn.Linear(4, 2)
    model.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(InputError, match="^warmup: m: "):
        gemmtune.warmup(model, torch.randn(3, 4), backends=EXTERN, progress=False, m="64:1")
    assert calls == []


def test_a_range_draws_one_random_a_per_family_and_gives_each_bucket_its_layout():
    from gemmtune.dispatch.buckets import at_m, at_ms

    w = torch.randn(5, 4).t()  # B: K = 4, N = 5
    biases = (torch.randn(3, 5)[:1].expand(3, 5), torch.randn(5), torch.randn(1, 5))  # a broadcast row, 1-D, (1, N)
    for a in (torch.randn(3, 4), torch.randn(4, 3).t()):  # A row-major, then column-major
        for bias in biases:
            ops = at_ms("addmm", (bias, a, w), [1, 2, 64, 512])
            for m, got in ops.items():
                want = at_m("addmm", (bias, a, w), m)
                assert [(t.shape, t.stride()) for t in got] == [(t.shape, t.stride()) for t in want]
                assert got[2] is w and torch.isfinite(got[1]).all()
                torch.testing.assert_close(torch.addmm(*got), torch.addmm(got[0].double(), got[1].double(),
                                                                          w.double()).float(), rtol=1e-4, atol=1e-4)
            shared = len({ops[m][1].data_ptr() for m in ops}) == 1
            assert shared == (a.stride(1) == 1)  # a column-major A of each M is its own
