"""GPU test of `share_kernels`: a pick tuned in one process, with its Triton kernels kept in the store,
loads in a process with a new Triton cache (a new machine) without compiling or running a C compiler.

Run on an H200:  python -m pytest -q -s tests/gpu/test_share_kernels_gpu.py
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SIDE = textwrap.dedent("""
    import json, sys, time
    import torch, triton
    from triton import knobs
    from triton.runtime import build
    import gemmtune

    import triton.runtime.cache as triton_cache
    from gemmtune.templates.triton import wheel_key

    own, hashed = triton_cache.triton_key, []  # count Triton hashing itself in this process
    def counted():
        hashed.append(1)
        return own()
    counted.cache_info = own.cache_info
    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", {}).get("triton_key") is own:
            module.triton_key = counted
    root = triton_cache.__file__.rsplit("/runtime/", 1)[0]
    hits, builds = [], []
    knobs.compilation.listener = lambda **info: hits.append(info["cache_hit"])
    real_build = build._build
    build._build = lambda *a, **k: builds.append(a[0]) or real_build(*a, **k)
    torch.manual_seed(0)
    a = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    sel = gemmtune.tune("mm", a, b, backends=("triton",))
    err = ((sel.kernel(a, b).float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
    print(json.dumps(dict(hits=hits, builds=builds, cache_hit=sel.cache_hit, pick=sel.winner.key,
                          seconds=time.perf_counter() - t0, err=err, hashed=len(hashed),
                          wheel=wheel_key.signature(root, triton.__version__) is not None,
                          manager_put_back=knobs.cache.manager_class is None)))
""")


def _side(tmp_path, cache: str, share: bool) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / cache), "GEMMTUNE_STORE": str(tmp_path / "store.sqlite"),
           "GEMMTUNE_CACHE_DIR": str(tmp_path / f"{cache}-gemmtune"),  # a new machine: Triton's key not kept here
           "GEMMTUNE_SHARE_KERNELS": "1" if share else "0", "GEMMTUNE_EFFORT": "quick",
           "GEMMTUNE_STORE_KEY": "a-fleet-secret-of-32-characters!"}  # kernels are shared only under a key
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", SIDE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_shared_pick_loads_on_a_new_triton_cache_with_nothing_compiled(tmp_path):
    tuned = _side(tmp_path, "machine-a", share=True)
    assert not tuned["cache_hit"] and False in tuned["hits"]  # tuned: its candidates compiled
    loaded = _side(tmp_path, "machine-b", share=True)
    print(f"\ntuned in {tuned['seconds']:.2f} s ({len(tuned['builds'])} native builds); on a new Triton cache "
          f"{loaded['seconds']:.2f} s, kernels {loaded['hits']}, native builds {loaded['builds']}")
    assert loaded["cache_hit"] and loaded["pick"] == tuned["pick"]
    assert tuned["manager_put_back"] and loaded["manager_put_back"]  # the store served gemmtune's compiles only
    assert loaded["hits"] and all(loaded["hits"]), loaded  # every kernel came from the store
    assert loaded["builds"] == [], loaded  # the launcher and driver stub too: no C compiler ran
    assert loaded["err"] < 2e-2
    print(f"Triton hashed itself {tuned['hashed']} time(s) on the first machine, {loaded['hashed']} on the new one "
          f"(its wheel's RECORD vouches for its files: {loaded['wheel']})")
    assert tuned["hashed"] >= 1
    if loaded["wheel"]:
        assert loaded["hashed"] == 0  # Triton's key of itself came from the store


def test_without_sharing_a_new_triton_cache_compiles_the_pick(tmp_path):
    _side(tmp_path, "machine-a", share=False)
    loaded = _side(tmp_path, "machine-b", share=False)
    assert loaded["cache_hit"] and False in loaded["hits"]
