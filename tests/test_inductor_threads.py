"""A thread's choices handler follows install() / uninstall() (`inductor.installer.sync_thread`).

Inductor makes each thread's handler once and keeps it, and a backward graph is compiled in
autograd's device thread.  A process that compiled a backward before `install()` would otherwise
compile every later backward without gemmtune (on the H200 a training step then built a default
compile's GEMMs), and one that installed first would keep gemmtune after `uninstall()`.  One
long-lived worker thread stands in for autograd's here, each call run in a copy of the caller's
context, as `loss.backward()` hands it to autograd's threads (torch's config is per context there)."""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import gemmtune.inductor as gi
from gemmtune.inductor import installer
from gemmtune.inductor.handler import is_gemmtune_handler

from helpers import fresh_inductor  # noqa: F401 - the fixture

pytestmark = [pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table"),
              pytest.mark.usefixtures("fresh_inductor")]


def _run(worker, fn, *args):
    """`fn(*args)` in the worker thread, in a copy of this thread's context (config included)."""
    return worker.submit(contextvars.copy_context().run, fn, *args).result()


def _choices():
    from torch._inductor.virtualized import V

    return V.choices


def _compile_mm(n: int):
    w = torch.randn(16, n)
    x = torch.randn(8, 16)
    out = torch.compile(lambda a: (a @ w).relu(), fullgraph=True)(x)
    torch.testing.assert_close(out, (x @ w).relu())


def test_a_thread_whose_handler_was_made_before_install_compiles_with_gemmtune():
    with ThreadPoolExecutor(max_workers=1) as worker:
        before = _run(worker, _choices)  # Inductor makes this thread's handler now
        assert not is_gemmtune_handler(before)
        handler = gi.install()
        _run(worker, _compile_mm, 12)
        assert handler.stats["hit"] + handler.stats["tuned"] >= 1, handler.stats
        assert _run(worker, _choices) is handler


def test_a_thread_keeps_no_uninstalled_handler():
    with ThreadPoolExecutor(max_workers=1) as worker:
        handler = gi.install()
        assert _run(worker, _choices) is handler  # made from the config: the installed one
        gi.uninstall()
        asked = dict(handler.stats)
        torch._dynamo.reset()
        _run(worker, _compile_mm, 20)
        assert dict(handler.stats) == asked  # the uninstalled handler was not asked
        assert not is_gemmtune_handler(_run(worker, _choices))


def test_a_handler_set_for_a_thread_on_purpose_is_kept():
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    class Mine(InductorChoices):
        pass

    mine = Mine()
    with ThreadPoolExecutor(max_workers=1) as worker:
        _run(worker, V.set_choices_handler, mine)
        gi.install()
        _run(worker, installer.sync_thread)
        assert _run(worker, _choices) is mine
