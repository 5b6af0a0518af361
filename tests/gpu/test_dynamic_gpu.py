"""Compiled GEMMs with a symbolic M on a GPU (`gemmtune.inductor.dynamic`): bf16 linear layers compiled
with `dynamic=True` under `gemmtune.inductor.install(m=...)` in the default, max-autotune-no-cudagraphs
and reduce-overhead modes; every M's output checked against eager; Triton picks built for a new M from
their bucket; the host time the bucketed call adds printed beside the static pick's (not asserted).

    python -m pytest -q -s tests/gpu/test_dynamic_gpu.py
"""

from __future__ import annotations

import time

import pytest
import torch

import gemmtune
import gemmtune.inductor as gi
from gemmtune.inductor import dynamic

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(not gi.available(), reason="this torch has no Inductor lookup table")]

K, N = 1024, 768
MS = (1, 5, 16, 100, 256, 300)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    from torch._inductor import config

    monkeypatch.setenv("GEMMTUNE_STORE", str(tmp_path / "store.sqlite"))
    torch._dynamo.reset()
    dynamic.reset()
    with config.patch(fx_graph_cache=False, autotune_local_cache=False):
        yield
    from gemmtune.inductor import installer

    while installer._PRIOR:
        gi.uninstall()
    torch._dynamo.reset()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.GELU(), torch.nn.Linear(N, K, bias=False)).to(
        "cuda", torch.bfloat16)


@pytest.mark.parametrize("mode", [None, "max-autotune-no-cudagraphs", "reduce-overhead"])
def test_every_m_runs_its_buckets_pick_and_matches_eager(mode):
    model = _mlp()
    handler = gi.install(m="1:256")
    f = torch.compile(model, dynamic=True, mode=mode)
    with torch.no_grad():
        for m in MS:
            x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
            for _ in range(2):  # reduce-overhead records a CUDA graph on a later call
                torch.testing.assert_close(f(x), model(x), rtol=2e-2, atol=2e-2)
    assert handler.stats["bucketed"] == 2, handler.stats  # both layers, M symbolic (1 is a graph of its own)
    picks = [dynamic.parse_table(t)[3] for t in handler.tables.values()]
    assert all({1, 16, 256} <= set(p) <= {1, 2, 4, 8, 16, 32, 64, 128, 256} for p in picks)  # coarse, then bisected
    print(f"\n{mode}: picks {picks}; {dict(dynamic.STATS)}")


def test_a_triton_bucket_pick_is_built_for_a_new_m_and_the_call_adds_little_host_time():
    model = torch.nn.Linear(K, N, bias=False).to("cuda", torch.bfloat16)
    handler = gi.install(settings=gemmtune.Settings(backends=("triton",)), m=[64, 128])
    f = torch.compile(lambda t: model(t), dynamic=True)  # a code object of its own: `static` below is apart
    x = torch.randn(100, K, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(f(x), model(x), rtol=2e-2, atol=2e-2)
        (text,) = handler.tables.values()
        assert all(k.startswith("triton") for k in dynamic.parse_table(text)[3].values())
        assert dynamic.STATS["builds"] == 1  # M = 100: bucket 128's kernel, built for 100
        static = torch.compile(lambda t: model(t), dynamic=False)
        static(x)
        print(f"\nhost us per call: bucketed {_host_us(f, x):.1f}, static pick {_host_us(static, x):.1f}")


def _host_us(fn, x, n: int = 200) -> float:
    for _ in range(10):
        fn(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(x)
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host
