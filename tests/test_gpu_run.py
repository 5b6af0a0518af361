"""bench/gpu_run.py, the GPU runner: its jobs name files and shapes that exist, lanes go one per GPU, every
job's outcome reaches the summary and the exit status; the CUTLASS set-up unpacks the carried pack (no
GPU needed)."""

import importlib.util
import json
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def runner(monkeypatch):
    spec = importlib.util.spec_from_file_location("gemmtune_bench_gpu_run", ROOT / "bench" / "gpu_run.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_gpu_test_file_runs_in_a_job_of_its_own_group(runner):
    named = {arg for name, job in runner.JOBS.items() if name != "tests-all" for arg in job.argv}
    files = {f"tests/gpu/{p.name}" for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    assert files and files <= named, sorted(files - named)  # tests-all alone is too long for one call


def test_every_job_names_files_and_shapes_that_exist(runner):
    def names(suite):
        return {s["name"] for s in json.loads((ROOT / suite).read_text())["shapes"]}

    for name, job in runner.JOBS.items():
        assert job.argv or job.unpack, name
        suite = next((job.argv[i + 1] for i, a in enumerate(job.argv[:-1]) if a == "--suite"), "bench/shapes.json")
        for i, arg in enumerate(job.argv):
            if arg.startswith(("bench/", "tests/")):
                assert (ROOT / arg).exists(), f"{name}: {arg}"
            if i and job.argv[i - 1] in ("--only", "--exhaustive"):
                assert set(arg.split(",")) <= names(suite), f"{name}: {arg}"
    for preset, (lanes, doc) in runner.PRESETS.items():
        assert doc and all(n in runner.JOBS for lane in lanes for n in lane.split(",")), preset


def test_lanes_from_presets_and_job_lists(runner):
    assert runner.parse_lanes(["checks"]) == [r.split(",") for r in runner.PRESETS["checks"][0]]
    assert runner.parse_lanes(["fuzz-mm", "tests-api,tests-core"]) == [["fuzz-mm"], ["tests-api", "tests-core"]]
    with pytest.raises(ValueError, match="unknown job no-such-job"):
        runner.parse_lanes(["tests-api,no-such-job"])


def test_a_bad_lane_exits_2_naming_it(runner, capsys):
    with pytest.raises(SystemExit) as exc:
        runner.main(["no-such-job"])
    assert exc.value.code == 2 and "unknown job no-such-job" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runner.main([])


def test_dry_run_places_lanes_on_gpus(runner, tmp_path, capsys):
    assert runner.main(["--dry-run", "--gpus", "2", "--out", str(tmp_path), "checks"]) == 0
    text = capsys.readouterr().out
    assert "lane 0 on GPU 0" in text and "lane 1 on GPU 1" in text
    assert f"--out {tmp_path}/compare-six.json" in text
    assert runner.main(["--dry-run", "--gpus", "1", "models"]) == 0
    assert "lane 1 on GPU default (after lane 0)" in capsys.readouterr().out


def _job(runner, code, **kw):
    return runner.Job("test", (sys.executable, "-c", code), **kw)


def test_lanes_run_one_per_gpu_and_report_each_outcome(runner, tmp_path, capsys, monkeypatch):
    show_gpu = "import os; print('gpu', os.environ['CUDA_VISIBLE_DEVICES'])"
    monkeypatch.setattr(runner, "JOBS", {
        "a": _job(runner, show_gpu), "b": _job(runner, show_gpu),
        "fails": _job(runner, "import sys; print('bad'); sys.exit(3)"),
        "hangs": _job(runner, "import time; time.sleep(30)", timeout_s=0.5),
    })
    assert runner.run_lanes([["a", "fails"], ["b", "hangs"]], tmp_path, gpus=2, tail=2) == 1
    assert (tmp_path / "a.log").read_text() == "gpu 0\n" and (tmp_path / "b.log").read_text() == "gpu 1\n"
    assert "timed out after 0 s" in (tmp_path / "hangs.log").read_text()
    summary = capsys.readouterr().out
    for line in ("==> a (GPU 0): ok <==", "==> fails (GPU 0): rc=3 <==", "==> b (GPU 1): ok <==",
                 "==> hangs (GPU 1): timed out <=="):
        assert line in summary
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert runner.run_lanes([["a"]], tmp_path, gpus=0) == 1  # one lane on no GPU: no CUDA_VISIBLE_DEVICES set
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert runner.run_lanes([["a"], ["b"]], tmp_path, gpus=1) == 0  # in turn, on the default GPU
    assert (tmp_path / "b.log").read_text() == "gpu 7\n"


def test_dsl_jobs_skip_without_the_unpacked_dsl(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "DSL", tmp_path / "absent")
    monkeypatch.setattr(runner, "JOBS", {"dsl": _job(runner, "raise SystemExit(1)", dsl=True)})
    assert runner.run_lanes([["dsl"]], tmp_path, gpus=0) == 0
    assert "skipped: no absent/" in (tmp_path / "dsl.log").read_text()


def test_cutlass_setup_unpacks_the_carried_pack_into_a_new_dsl_folder(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "ROOT", tmp_path)
    monkeypatch.setattr(runner, "DSL", tmp_path / ".cutedsl")
    job = runner.JOBS["cutlass-setup"]
    assert runner.run_job("cutlass-setup", job, tmp_path, None) == "rc=2"
    assert ".whl/cutlass/ is not here" in (tmp_path / "cutlass-setup.log").read_text()
    (tmp_path / ".cutedsl").mkdir()
    (tmp_path / ".cutedsl" / "stale.py").write_text("left from an earlier set-up")
    pack = tmp_path / ".whl" / "cutlass"
    pack.mkdir(parents=True)
    with zipfile.ZipFile(pack / "fake-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("fake_pkg/__init__.py", "X = 1\n")
    (tmp_path / "ops.py").write_text("__version__ = '0.3.0'\n")
    with tarfile.open(pack / "cutlass.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "ops.py", arcname="cutlass/operators/__init__.py")
    assert runner.run_job("cutlass-setup", job, tmp_path, None) == "rc=1"  # no real DSL here: the import check says so
    assert (tmp_path / ".cutedsl" / "fake_pkg" / "__init__.py").read_text() == "X = 1\n"
    assert (tmp_path / ".cutedsl" / "cutlass" / "operators" / "__init__.py").is_file()
    assert not (tmp_path / ".cutedsl" / "stale.py").exists()
    log = (tmp_path / "cutlass-setup.log").read_text()
    assert ".cutedsl: 0 MiB" in log and "MISSING DEPS" in log and "Error" in log  # no cuda.bindings here


def test_every_bench_file_the_docs_cite_exists():
    cited = re.compile(r"bench/(?:results/)?[A-Za-z0-9_.-]+\.(?:py|sh|json|jsonl|log)(?:\.gz)?\b")
    # CHANGELOG.md is left out: it tells history, and names scripts and runs that git keeps.
    roots = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "src").rglob("*.py"), *(ROOT / "bench").glob("*.py"), ROOT / "bench" / "README.md"]
    missing = [f"{f.relative_to(ROOT)}: {m}" for f in roots for m in cited.findall(f.read_text())
               if not (ROOT / m).exists()  # a script's default output path is not a citation
               and not (f.parent.name == "bench" and m.startswith("bench/results/"))]
    assert missing == []


def test_the_wheel_packer_downloads_the_pinned_wheels_for_the_gpu_machine(capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import cutlass_wheels
    finally:
        sys.path.pop(0)
    assert cutlass_wheels.main(["--dry-run"]) == 0
    printed = capsys.readouterr().out
    for pin in ("nvidia-cutlass-dsl-libs-cu13==4.8.1", "nvidia-cutlass-operators==0.3.0", "--python-version 3.12"):
        assert pin in printed
    assert ".whl/cutlass/cutlass.tar.xz" in printed
