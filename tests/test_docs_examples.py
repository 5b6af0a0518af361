"""The code blocks of the README and every guide in docs/ run as pasted: each ```python block in a fresh
interpreter (temporary cache directory, in-memory store), each `gemmtune ...` line of a ```bash block
parsed by the real command line (and the cheap ones run).  No document cites a file outside the repo."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

GENERATED = {"SETTINGS.md", "CLI.md", "API.md", "RESULTS.md"}  # rendered from the code and the result files
DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in GENERATED)]
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)  # a block in a list item is indented


def blocks(path: Path, lang: str) -> list[str]:
    return [textwrap.dedent(body) for _, tag, body in FENCE.findall(path.read_text()) if tag == lang]


def python_blocks() -> list:
    return [pytest.param(doc, i, body, id=f"{doc.name}-{i}")
            for doc in DOCS for i, body in enumerate(blocks(doc, "python"))]


def gemmtune_lines() -> list:
    out = []
    for doc in DOCS:
        for body in blocks(doc, "bash"):
            for line in body.splitlines():
                cmd = line.split(" #")[0].strip()
                if cmd.startswith("gemmtune "):
                    out.append(pytest.param(cmd, id=f"{doc.name}:{cmd[:60]}"))
    return out


@pytest.fixture(scope="module")
def numba_cache(tmp_path_factory):
    """One cache directory for every block, so numba compiles its kernels once for the module."""
    return tmp_path_factory.mktemp("docs_cache")


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ, GEMMTUNE_CACHE_DIR=str(cache), GEMMTUNE_STORE="memory",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)  # the blocks run as a user would run them
    return env


def test_the_readme_has_examples_and_the_documented_sections():
    text = (REPO / "README.md").read_text()
    assert len(blocks(REPO / "README.md", "python")) >= 3
    for needle in ("## Install", "## Quick start", "make demo", "make test", "## Limits", "gemmtune.warmup(model, x",
                   "gemmtune.inductor.install()", "torch.compile", "## What to expect", "bench/shapes_cpu.json"):
        assert needle in text, needle
    for doc in ("GETTING_STARTED", "MODELS", "SCALE", "FP8", "RELIABILITY", "ARCHITECTURE", "RESULTS", "CLI", "API",
                "SETTINGS"):
        assert f"docs/{doc}.md" in text, doc
    assert "CHANGELOG.md" in text and (REPO / "CHANGELOG.md").is_file() and (REPO / "LICENSE").is_file()


def test_the_readme_reads_in_three_minutes_and_the_guides_stay_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150
    guides = [p for p in DOCS if p.parent.name == "docs"]
    assert sum(len(p.read_text().splitlines()) for p in guides) <= 2500, {p.name: len(p.read_text().splitlines())
                                                                         for p in guides}
    for name in GENERATED:
        head = (REPO / "docs" / name).read_text().splitlines()[:3]
        assert any("generated" in line.lower() for line in head), name


# Words of a diary, not of a guide: a guide states what is true today.
DIARY = re.compile(r"\bsession\b|next GPU run|\bsince then\b|\brun [A-Z]\b|\bissue #?\d", re.I)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_a_guide_does_not_narrate_its_own_making(doc):
    hits = [f"{doc.name}:{n}: {line.strip()}" for n, line in enumerate(doc.read_text().splitlines(), 1)
            if DIARY.search(line)]
    assert not hits, "\n".join(hits)


def test_every_cited_document_exists():
    """A page named in the docs, the code, the tests or the benchmarks is there (CHANGELOG tells history)."""
    cited = re.compile(r"docs/[A-Za-z0-9_]+\.md")
    roots = [REPO / "README.md", REPO / "Makefile", REPO / "pyproject.toml",
             *(REPO / d for d in ("docs", "src", "tests", "bench"))]
    missing = set()
    for root in roots:
        for f in [root] if root.is_file() else root.rglob("*"):
            built = any(part.endswith(".egg-info") for part in f.parts)  # pip's copy of an older README
            if f.is_file() and f.suffix in {".md", ".py", ".toml", ""} and "results" not in f.parts and not built:
                missing |= {f"{f.relative_to(REPO)}: {m}" for m in cited.findall(f.read_text(errors="replace"))
                            if not (REPO / m).is_file()}
    assert not missing, "\n".join(sorted(missing))


def test_every_cuda_block_guards_itself():
    for doc in DOCS:
        for body in blocks(doc, "python"):
            if "cuda" in body:
                assert "torch.cuda.is_available()" in body, body


@pytest.mark.slow
@pytest.mark.parametrize("doc, index, body", python_blocks())
def test_python_block_runs_as_pasted(doc, index, body, numba_cache, tmp_path):
    script = tmp_path / f"block{index}.py"
    script.write_text(body)
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(numba_cache),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{doc.name} block {index} failed:\n{body}\n--- stderr ---\n{r.stderr[-4000:]}"


CHEAP = {"simulate", "cache"}


@pytest.mark.parametrize("cmd", gemmtune_lines())
def test_gemmtune_command_parses_and_cheap_ones_run(cmd, numba_cache, tmp_path):
    from gemmtune.cli import build_parser

    argv = shlex.split(cmd)[1:]
    # Repo-relative paths (bench/shapes.json, the shipped data) as from a checkout.
    argv = [str(REPO / a) if (REPO / a).exists() and not Path(a).is_absolute() else a for a in argv]
    if argv[0] != "simulate":
        build_parser().parse_args(argv)  # unknown options or bad choices exit here
    if argv[0] not in CHEAP or "import" in argv:
        return
    if "--plot" in argv:
        pytest.importorskip("matplotlib")
    r = subprocess.run([sys.executable, "-c", "import sys; from gemmtune.cli import main; sys.exit(main())", *argv],
                       cwd=tmp_path, env=_env(numba_cache), capture_output=True, text=True, timeout=600)
    nothing_stored = argv[:2] == ["cache", "show"] and r.returncode == 1 and "no stored problem matches" in r.stderr
    assert r.returncode == 0 or nothing_stored, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"


def test_no_document_cites_a_file_outside_the_repo():
    # Spelt in pieces so that this file does not match itself.
    outside = ["../" + "shared", "FACTS" + ".md", "shared" + "/bench", "shared" + "/data"]
    pattern = re.compile("|".join(map(re.escape, outside)) + "|" + "issue" + r" 5\b")
    roots = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "pyproject.toml", REPO / "Makefile",
             *(REPO / d for d in ("docs", "src", "tests", "bench"))]
    hits = []
    for root in roots:
        for f in [root] if root.is_file() else root.rglob("*"):
            if not f.is_file() or f.suffix not in {".md", ".py", ".toml", ".sh", ""} or "results" in f.parts:
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line):
                    hits.append(f"{f.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)
