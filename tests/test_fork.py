"""A fork child of a process that tuned with numba: it tunes and runs numba kernels and gets correct results.

Numba's parallel kernels run on GNU OpenMP threads here, which do not survive fork: without care the
child is killed by SIGTERM on its first numba kernel.  gemmtune's at-fork handler makes such a child
run the kernels' serial twins (gemmtune.templates.numba_fork).  torch itself needs
`torch.set_num_threads(1)` in a fork child whose parent ran multi-threaded torch ops (its OpenMP pool
does not survive fork either); DataLoader workers call it, and so do the children here.
"""

from __future__ import annotations

import os

import pytest
import torch

import gemmtune
from gemmtune.templates import numba_fork
from gemmtune.templates.cpu_numba import NumbaMMTemplate, numba_available
from gemmtune.templates.extern import AtenTemplate, NumpyTemplate
from helpers import wait_child

pytestmark = [pytest.mark.skipif(not numba_available() or not hasattr(os, "fork"), reason="numba and fork"),
              pytest.mark.usefixtures("memory_store")]
FAST = gemmtune.Settings(store="off", cpu_rep_ms=1, finalist_rounds=1, min_reps=1, max_reps=3)


@pytest.fixture(autouse=True)
def _small_pool(monkeypatch):
    import gemmtune.templates.registry as templates

    monkeypatch.setattr(templates, "default_templates", lambda *args, **kwargs: [
        AtenTemplate("mm"), AtenTemplate("addmm"), AtenTemplate("bmm"), NumpyTemplate(),
        NumbaMMTemplate(space=[(8, 64, 8)])])


def _child(a, b, c, d) -> int:
    """In the child: the parent's warm numba entry, and a new problem tuned and run with numba."""
    torch.set_num_threads(1)
    warm = gemmtune.mm(a, b, backends=("numba",))
    sel = gemmtune.tune("mm", c, d, backends=("numba",), settings=FAST)
    cold = gemmtune.addmm(d[0], c, d, backends=("numba",))
    ok = (torch.allclose(warm, a @ b, atol=1e-4) and torch.allclose(sel(c, d), c @ d, atol=1e-4)
          and torch.allclose(cold, torch.addmm(d[0], c, d), atol=1e-4) and sel.winner.template_uid == "numba_mm"
          and numba_fork.in_gnu_openmp_fork_child() == parent_on_gnu_openmp)
    return 0 if ok else 3


parent_on_gnu_openmp = False


def test_a_fork_child_tunes_and_runs_numba_after_the_parent_did():
    global parent_on_gnu_openmp
    a, b, c, d = torch.randn(40, 24), torch.randn(24, 72), torch.randn(33, 20), torch.randn(20, 70)
    assert gemmtune.tune("mm", a, b, backends=("numba",), settings=FAST).winner.template_uid == "numba_mm"
    torch.testing.assert_close(gemmtune.mm(a, b, backends=("numba",)), a @ b)  # parallel kernels ran here
    parent_on_gnu_openmp = numba_fork.gnu_openmp_started()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 4
        try:
            code = _child(a, b, c, d)
        finally:
            os._exit(code)
    assert wait_child(pid, 120.0) == 0  # -15: killed by numba's GNU OpenMP fork check; 3: a wrong result; -9: hung
    assert not numba_fork.in_gnu_openmp_fork_child()  # the parent keeps its parallel kernels
    torch.testing.assert_close(gemmtune.mm(a, b, backends=("numba",)), a @ b)


class _Products(torch.utils.data.Dataset):
    def __init__(self, w):
        self.w = w

    def __len__(self):
        return 3

    def __getitem__(self, i):
        x = torch.full((16, 24), float(i + 1))
        return gemmtune.mm(x, self.w, backends=("numba",)), x @ self.w


def test_dataloader_fork_workers_run_numba_kernels():
    w = torch.randn(24, 64)
    torch.testing.assert_close(gemmtune.mm(torch.ones(16, 24), w, backends=("numba",)), torch.ones(16, 24) @ w)
    loader = torch.utils.data.DataLoader(_Products(w), batch_size=None, num_workers=1,
                                         multiprocessing_context="fork", timeout=120)
    got = list(loader)
    assert len(got) == 3
    for ours, want in got:
        torch.testing.assert_close(ours, want)
