"""The persistent store, lookup tables and output layouts."""

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import gemmtune
from gemmtune.cli import main
from gemmtune.store.lookup import LookupTable
from gemmtune.store.sqlite import Store
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate

from helpers import ScriptedTemplate

SRC = Path(__file__).resolve().parents[1] / "src"


def mats(M=48, K=32, N=40):
    return torch.randn(M, K), torch.randn(K, N)


def test_second_tune_is_a_cache_hit(tmp_path, capsys):
    args = ["tune", "--no-progress", "--device", "cpu", "--shape", "80x48x64", "--store", str(tmp_path / "s.db")]
    assert main([*args, "--json", str(tmp_path / "1.json")]) == 0
    assert main([*args, "--json", str(tmp_path / "2.json")]) == 0
    first, second = (json.loads((tmp_path / f"{i}.json").read_text()) for i in (1, 2))
    assert first["benchmark_runs"] > 0 and not first["cache_hit"]
    assert second["benchmark_runs"] == 0 and second["cache_hit"]
    assert second["winner_key"] == first["winner_key"]
    assert "cache hit" in capsys.readouterr().out


def test_hit_returns_a_working_kernel_and_same_timings():
    a, b = mats()
    templates = [AtenTemplate("mm"), ScriptedTemplate()]
    first = gemmtune.tune("mm", a, b, templates=templates)
    second = gemmtune.tune("mm", a, b, templates=templates)
    assert second.cache_hit and second.winner == first.winner and second.benchmark_runs == 0
    torch.testing.assert_close(second(a, b), a @ b)


def test_changed_template_source_makes_its_entries_unused():
    a, b = mats()
    gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate("t", mode="ok")])
    changed = ScriptedTemplate("t", mode="ok")
    changed.src_hash = "0" * 64  # same uid and configs, new source
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), changed], strategy="exhaustive")
    assert not sel.cache_hit
    assert sel.stale_entries > 0
    assert sel.benchmark_runs >= 4  # every choice of the changed template measured again
    again = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), changed], strategy="exhaustive")
    assert again.cache_hit and again.stale_entries == 0  # the new timings replaced the stale ones


def test_partial_hit_benchmarks_only_new_choices():
    a, b = mats()
    gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), NumpyTemplate()], strategy="exhaustive")
    new = ScriptedTemplate("new", n_configs=1, runtime=(1,))
    sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), NumpyTemplate(), new], strategy="exhaustive")
    assert not sel.cache_hit and sel.from_store == 2
    new_timed = [t for t in sel.timings if t.choice.template_uid == "new"]
    assert new_timed and new_timed[0].ms is not None
    # one new choice timed, plus the interleaved re-time of the finalists it joined
    assert sel.benchmark_runs == 1 + sum(t.stage == "finalist" for t in sel.timings)


def test_store_keys_include_output_layout():
    a, b = mats()
    gemmtune.tune("mm", a, b, backends=("extern",))
    col = gemmtune.tune("mm", a, b, backends=("extern",), out_layout="col")
    assert not col.cache_hit


def test_flexible_layout_honours_col_without_copy():
    a, b = mats(37, 16, 29)
    sel = gemmtune.tune("mm", a, b, backends=("extern",), out_layout="col")
    assert sel.layout.kind == "flexible" and sel.out_layout == "col"
    out = sel(a, b)
    assert out.shape == (37, 29) and out.stride() == (1, 37)
    torch.testing.assert_close(out, a @ b)
    bias = torch.randn(29)
    sel = gemmtune.tune("addmm", bias, a, b, backends=("extern",), out_layout="col", alpha=2.0, beta=0.5)
    out = sel(bias, a, b)
    assert out.stride() == (1, 37)
    torch.testing.assert_close(out, torch.addmm(bias, a, b, alpha=2.0, beta=0.5))


def test_fixed_layout_refuses_col_with_a_reason():
    with pytest.raises(gemmtune.LayoutError, match="fixed row-major"):
        gemmtune.tune("mm", *mats(), templates=[AtenTemplate("mm"), ScriptedTemplate()], out_layout="col")
    with pytest.raises(gemmtune.InputError, match="out_layout"):
        gemmtune.tune("mm", *mats(), backends=("extern",), out_layout="diagonal")


def test_corrupted_store_is_moved_aside_and_rebuilt(tmp_path):
    path = tmp_path / "store.sqlite"
    Store(path).close()
    with open(path, "r+b") as f:  # damage the pages after the header (which keeps gemmtune's marker)
        f.seek(100)
        f.write(b"this is not a database" * 400)
    with pytest.warns(RuntimeWarning, match="corrupted"):
        store = Store(path)
    assert any(p.name.startswith("store.sqlite.corrupt-") for p in tmp_path.iterdir())
    a, b = mats()
    sel = gemmtune.tune("mm", a, b, backends=("extern",), store=store)
    assert gemmtune.tune("mm", a, b, backends=("extern",), store=store).cache_hit
    assert sqlite3.connect(path).execute("SELECT count(*) FROM picks").fetchone()[0] == 1
    assert sel.winner.is_extern


def test_unwritable_location_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.warns(RuntimeWarning, match="in memory"):
        store = Store(blocker / "store.sqlite")
    assert store.path == ":memory:"
    a, b = mats()
    gemmtune.tune("mm", a, b, backends=("extern",), store=store)
    assert gemmtune.tune("mm", a, b, backends=("extern",), store=store).cache_hit


def test_export_import_and_lookup_table(tmp_path):
    a, b = mats()
    s1 = Store(tmp_path / "one.sqlite")
    first = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate()], store=s1)
    exported = s1.export()
    (tmp_path / "picks.json").write_text(json.dumps(exported))

    s2 = Store(tmp_path / "two.sqlite")
    assert s2.import_(exported) == 1
    assert gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate()], store=s2).cache_hit

    # The export loads as a lookup table: the pick is pinned, nothing is searched or timed.
    settings = gemmtune.Settings(lookup_table=str(tmp_path / "picks.json"), store="off")
    pinned = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), ScriptedTemplate()], settings=settings)
    assert pinned.winner == first.winner and pinned.benchmark_runs == 0 and pinned.strategy == "pinned"
    assert pinned.n_choices == 1
    torch.testing.assert_close(pinned(a, b), a @ b)
    assert pinned.winner_ms is None and "(not timed: the only candidate (" in gemmtune.autotune_table(pinned)


def test_lookup_table_drops_stale_entries_with_a_warning():
    a, b = mats()
    ki = gemmtune.KernelInputs.from_tensors("mm", a, b)
    t = ScriptedTemplate()
    table = LookupTable({ki.problem_key: [{"template": t.uid, "src_hash": "old", "config": {"TILE": 8},
                                           "runtime_params": {"group": 1}}]})
    with pytest.warns(RuntimeWarning, match="entry dropped"):
        sel = gemmtune.tune("mm", a, b, templates=[AtenTemplate("mm"), t], finalize=[table], store=Store())
    assert sel.n_choices == 5 and table.stale  # no hit: the full search ran


def test_bad_lookup_table_is_a_clear_error(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="lookup table"):
        LookupTable.load(bad)


def test_cache_cli_ls_show_export_import_clear(tmp_path, capsys):
    store = str(tmp_path / "s.db")
    main(["tune", "--no-progress", "--device", "cpu", "--shape", "16x8x12", "--backends", "extern", "--store", store])
    assert main(["cache", "ls", "--store", store]) == 0
    assert "aten_mm" in capsys.readouterr().out
    assert main(["cache", "export", str(tmp_path / "e.json"), "--store", store]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["entries"][0]["describe"] == "mm(16x8, 8x12)"
    assert main(["cache", "show", "16x8", "--json", "--store", store]) == 0
    assert '"timings"' in capsys.readouterr().out
    assert main(["cache", "clear", "--yes", "--store", store]) == 0
    assert "cleared 1 picks" in capsys.readouterr().out
    assert main(["cache", "import", str(tmp_path / "e.json"), "--store", str(tmp_path / "other.db")]) == 0
    assert main(["cache", "import", str(tmp_path / "missing.json"), "--store", store]) == 2


WORKER = textwrap.dedent("""
    import dataclasses, os, sys, time, torch, gemmtune
    from gemmtune.measure import load
    from gemmtune.measure.runners import LocalRunner
    path, seed, slow, done, release = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    # Every pick is decided as if under load: stored provisional, so a later run would re-check it.
    load.loaded_here = lambda cores: True
    # `slow` (a template uid, or "-"): its timings read a second more, and no reading has a spread, so that
    # runs differing in it decide differently whatever the machine's load does to the real readings (a
    # spread as wide as the reading, as a loaded machine gives a microsecond kernel, would keep torch's op).
    time_one, time_all = LocalRunner.time, LocalRunner.time_interleaved
    scaled = lambda t: t if t.ms is None else dataclasses.replace(
        t, ms=t.ms + 1000.0 * (t.choice.template_uid == slow), spread=0.0)
    LocalRunner.time = lambda self, c, stage, *, check: scaled(time_one(self, c, stage, check=check))
    LocalRunner.time_interleaved = lambda self, cs, rounds: [scaled(t) for t in time_all(self, cs, rounds)]
    torch.manual_seed(seed)
    out = []
    for M, K, N in [(64, 32, 48), (40, 24, 56), (96, 16, 8)]:
        a, b = torch.randn(M, K), torch.randn(K, N)
        sel = gemmtune.tune("mm", a, b, settings=gemmtune.Settings(store=path, backends=("extern", "numpy"),
                                                                   strategy="exhaustive", isolation="off"))
        assert torch.allclose(sel(a, b), a @ b, atol=1e-4)
        out.append(sel.winner.key)
    print(",".join(out), flush=True)
    open(done, "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(release) and time.monotonic() < deadline:  # holds the store until all are done
        time.sleep(0.02)
""")


def _fleet(tmp_path, path, cohorts: list[list[str]]) -> list[str]:
    """Cohorts of worker processes on one store, each cohort started once the one before it has stored its
    picks (so its runs begin after those picks were written); every process holds the store until all
    are done.  `cohorts`: the `slow` argument of each worker.  Returns each worker's picks."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    release, procs = tmp_path / "release", []
    try:
        for cohort in cohorts:
            first = len(procs)
            procs += [subprocess.Popen([sys.executable, str(script), str(path), str(len(procs) + i), slow,
                                        str(tmp_path / f"done{len(procs) + i}"), str(release)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                      for i, slow in enumerate(cohort)]
            deadline = time.monotonic() + 300
            while not all((tmp_path / f"done{i}").exists() for i in range(first, len(procs))):
                assert time.monotonic() < deadline and all(p.poll() is None for p in procs[first:]), \
                    [p.stderr.read()[-2000:] for p in procs if p.poll() is not None]
                time.sleep(0.05)
    finally:
        release.touch()
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1][-2000:] for r in results]
    return [r[0].strip() for r in results]


def test_eight_processes_share_one_store(tmp_path):
    """Eight processes tune at once, every pick stored provisional (as under load): they return the same
    picks, and the store holds one pick per problem and one row per choice."""
    path = tmp_path / "shared.sqlite"
    picks = set(_fleet(tmp_path, path, [["-"] * 8]))
    assert len(picks) == 1, picks  # every process returned the same picks
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM picks").fetchone()[0] == 3
    per_choice = db.execute("SELECT count(*) FROM timings GROUP BY env, problem, template, config, runtime").fetchall()
    assert per_choice and all(n == 1 for (n,) in per_choice)
    assert db.execute("SELECT count(*) FROM timings").fetchone()[0] == 3 * 2  # aten_mm + numpy_blas per shape


def test_a_process_that_starts_later_runs_the_pick_the_running_ones_run(tmp_path):
    """The processes running store provisional picks in which torch's kernel reads slow (so NumPy's BLAS
    wins); processes started after them, which would re-check those picks and find torch's kernel faster,
    serve the stored picks as stored while the first ones hold the store (docs/SCALE.md, one answer per
    problem).  Once every process is gone, a later run alone re-checks and replaces them."""
    path = tmp_path / "shared.sqlite"
    picks = _fleet(tmp_path, path, [["aten_mm", "aten_mm"], ["numpy_blas", "numpy_blas"]])
    assert len(set(picks)) == 1 and "numpy_blas" in picks[0], picks
    later = tmp_path / "later"
    later.mkdir()
    [alone] = _fleet(later, path, [["numpy_blas"]])
    assert "numpy_blas" not in alone, alone  # re-checked, alone: torch's kernel, now the faster one


def test_a_pick_saved_while_another_process_reads_comes_with_its_rows_or_not_at_all(tmp_path, monkeypatch):
    """A load reads rows, pick and mark in three statements.  Another process's save landing between
    them must not show its pick without its rows: a reader would take that pick for a broken one
    and write over it while the writer runs it (two answers for one problem)."""
    from gemmtune.store import sqlite_entries
    from gemmtune.store.keys import Row
    path = str(tmp_path / "s.sqlite")
    reader, writer = Store(path), Store(path)
    pick = Row("numpy_blas", None, "{}", "{}", 1.0, "ok")
    read_rows, saved = sqlite_entries.read_rows, []

    def rows_then_a_save(db, *args, **kwargs):
        got = read_rows(db, *args, **kwargs)
        if db is reader._db and not saved:  # the other's save lands after the rows were read, before the pick
            saved.append(writer.save("env", {}, "p", "p", [pick], pick, replace_pick=False))
        return got

    monkeypatch.setattr(sqlite_entries, "read_rows", rows_then_a_save)
    first = reader.load("env", "p")
    assert saved and first.pick is None and first.rows == ()  # the snapshot from before the save
    again = reader.load("env", "p")
    assert again.pick == pick and again.rows == (pick,)


def test_prescreen_pick_is_a_full_hit_but_exhaustive_measures_the_pruned_rest():
    a, b = mats()
    templates = [AtenTemplate("mm"), ScriptedTemplate(n_configs=8, runtime=(1, 2, 4))]
    settings = gemmtune.Settings(top_x=2)
    first = gemmtune.tune("mm", a, b, templates=templates, settings=settings)
    pruned = sum(t.status == "not_benchmarked" for t in first.timings)
    assert pruned > 0
    second = gemmtune.tune("mm", a, b, templates=templates, settings=settings)
    assert second.cache_hit and second.benchmark_runs == 0 and second.winner == first.winner
    exh = gemmtune.tune("mm", a, b, templates=templates, strategy="exhaustive")
    assert not exh.cache_hit and exh.from_store == first.n_choices - pruned
    assert exh.benchmark_runs >= pruned
    assert all(t.ms is not None for t in exh.timings)
    assert gemmtune.tune("mm", a, b, templates=templates, strategy="exhaustive").cache_hit


def test_a_stale_stored_pick_is_never_returned_and_gets_replaced():
    a, b = mats()
    first = gemmtune.tune("mm", a, b, templates=[ScriptedTemplate("only", n_configs=1, runtime=(1,))])
    changed = ScriptedTemplate("only", n_configs=1, runtime=(1,))
    changed.src_hash = "f" * 64
    second = gemmtune.tune("mm", a, b, templates=[changed])
    assert not second.cache_hit and second.stale_entries == 1
    assert second.winner.src_hash == "f" * 64 and first.winner.src_hash != second.winner.src_hash
    third = gemmtune.tune("mm", a, b, templates=[changed])
    assert third.cache_hit and third.winner.src_hash == "f" * 64
