"""The install story: extras that never make pip replace the installed torch, the stated torch range,
an SPDX license, and the README's CPU install."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info < (3, 11):
    pytest.skip("tomllib is Python 3.11+", allow_module_level=True)
import tomllib  # noqa: E402

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
README = (ROOT / "README.md").read_text()


def _requirements() -> list[str]:
    return [*PROJECT["dependencies"], *(r for extra in PROJECT["optional-dependencies"].values() for r in extra)]


def test_no_extra_pins_torch_or_triton():
    pinned = [r for r in _requirements() if re.match(r"(torch|triton)\b", r) and ("==" in r or "<" in r)]
    assert pinned == []  # a pin would make pip swap the torch the user installed (and its CUDA build)


def test_the_readme_states_the_torch_range_of_the_dependencies():
    torch_req = next(r for r in PROJECT["dependencies"] if r.startswith("torch"))
    lowest = torch_req.split(">=")[1]
    assert f"PyTorch ≥ {lowest}" in README
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in README


def test_the_license_is_an_spdx_expression_with_its_file():
    assert PROJECT["license"] == "BSD-3-Clause" and PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("BSD 3-Clause License")


def test_the_installed_torch_is_in_the_stated_range():
    import torch

    lowest = next(r for r in PROJECT["dependencies"] if r.startswith("torch")).split(">=")[1]
    have = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    assert have >= tuple(int(x) for x in lowest.split("."))
    from torch.library import triton_op, wrap_triton  # noqa: F401 - what the lower bound is for
