"""The numba_mm CPU template: configs, rendering, caching and results against a float64 reference.

Most tests use one tiny tile config (8x64x8), so the whole file compiles only a
few binaries; small shapes still span several tiles in both M and N.
"""

import dataclasses
import hashlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

numba = pytest.importorskip("numba")

from gemmtune.core.inputs import KernelInputs  # noqa: E402
from gemmtune.templates import cpu_numba, numba_load  # noqa: E402
from gemmtune.templates.cpu_numba import GROUPS, NumbaMMTemplate  # noqa: E402

SMALL = NumbaMMTemplate(space=[(8, 64, 8)])
DTYPES = (torch.float32, torch.float64)


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("gemmtune-cache")))
        yield


def reference(op, tensors, alpha=1.0, beta=1.0):
    d = [t.double() for t in tensors]
    if op == "mm":
        return d[0] @ d[1]
    if op == "bmm":
        return torch.bmm(d[0], d[1])
    prod = alpha * (d[1] @ d[2])
    return prod if beta == 0 else prod + beta * d[0]


def run_all(template, op, tensors, alpha=1.0, beta=1.0):
    """{choice key: output} for every choice of `template`, compiling each binary once."""
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    launchers, outs = {}, {}
    for choice in template.configs(ki):
        if choice.binary_key not in launchers:
            launchers[choice.binary_key] = template.compile(choice, ki, tensors)
        outs[choice.key] = launchers[choice.binary_key](tensors, **choice.runtime_dict)
    assert outs, "no choices"
    return ki, outs


def assert_matches(outs, ref, ki):
    tol = 1e-4 if ki.dtype == torch.float32 else 1e-11
    for key, out in outs.items():
        assert out.shape == ki.out_size and out.dtype == ki.dtype, key
        torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol, msg=lambda m: f"{key}: {m}")


def rand(*shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype)


# -- identity, supports, configs ----------------------------------------------------


def test_template_identity():
    t = NumbaMMTemplate()
    assert (t.uid, t.family) == ("numba_mm", "numba")
    assert t.src_hash == hashlib.sha256(cpu_numba.KERNEL_SOURCE.encode()).hexdigest()
    assert not t.is_extern
    assert dict(t.runtime_space) == {"group": (1, 4, 16)}
    assert dict(t.default_runtime) == {"group": 4}


def test_supports_cpu_float32_float64_only():
    t = NumbaMMTemplate()
    for dtype in DTYPES:
        assert t.supports(KernelInputs.from_tensors("mm", rand(4, 3, dtype=dtype), rand(3, 2, dtype=dtype)))
        assert t.supports(KernelInputs.from_tensors("bmm", rand(2, 4, 3, dtype=dtype), rand(2, 3, 2, dtype=dtype)))
        assert t.supports(KernelInputs.from_tensors("addmm", rand(2, dtype=dtype), rand(4, 3, dtype=dtype),
                                                    rand(3, 2, dtype=dtype)))
    for dtype in (torch.float16, torch.bfloat16):
        assert not t.supports(KernelInputs.from_tensors("mm", rand(4, 3).to(dtype), rand(3, 2).to(dtype)))
    ki = KernelInputs.from_tensors("mm", rand(4, 3), rand(3, 2))
    on_gpu = dataclasses.replace(ki, operands=tuple(dataclasses.replace(o, device="cuda:0") for o in ki.operands))
    assert not t.supports(on_gpu)


def test_module_imports_and_declines_without_numba(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # makes `import numba` fail
    spec = importlib.util.spec_from_file_location("gemmtune.templates._cpu_numba_probe", cpu_numba.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert not mod.numba_available()
    assert not mod.NumbaMMTemplate().supports(KernelInputs.from_tensors("mm", rand(4, 3), rand(3, 2)))


def test_configs_for_a_512_problem():
    t = NumbaMMTemplate()
    ki = KernelInputs.from_tensors("mm", rand(512, 512), rand(512, 512))
    cfgs = t.compile_configs(ki)
    tiles = [(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]) for c in cfgs]
    assert 6 <= len(tiles) <= 8 and len(set(tiles)) == len(tiles)
    assert all(bm in (32, 64, 128) and bn in (64, 128) and bk in (64, 128, 256) for bm, bn, bk in tiles)
    choices = t.configs(ki)
    assert len(choices) == len(cfgs) * len(GROUPS)
    assert len({c.key for c in choices}) == len(choices)
    assert {c.runtime_dict["group"] for c in choices} == set(GROUPS)
    assert all(c.src_hash == t.src_hash and c.family == "numba" for c in choices)


def test_configs_are_clamped_to_small_problems():
    t = NumbaMMTemplate()
    ki = KernelInputs.from_tensors("mm", rand(37, 29), rand(29, 53))
    tiles = [(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]) for c in t.compile_configs(ki)]
    assert len(set(tiles)) == len(tiles)
    assert all(bm <= 64 and bn == 64 and bk <= 32 for bm, bn, bk in tiles)
    ki = KernelInputs.from_tensors("mm", rand(1, 5), rand(5, 64))
    assert t.compile_configs(ki) == [{"BLOCK_M": 8, "BLOCK_N": 64, "BLOCK_K": 8}]


def test_rendered_kernel_file_has_literal_tiles_and_is_not_rewritten():
    cfg = {"BLOCK_M": 8, "BLOCK_N": 64, "BLOCK_K": 8}
    mod = cpu_numba.kernel_module(cfg)
    path = Path(mod.__file__)
    assert path.parent.name == "numba"
    assert NumbaMMTemplate.src_hash[:16] in path.name and "bm8_bn64_bk8" in path.name
    text = path.read_text()
    assert text == cpu_numba.render(cfg)
    assert "BLOCK_M = 8\n" in text and "BLOCK_N = 64\n" in text and "BLOCK_K = 8\n" in text
    before = path.stat().st_mtime_ns
    numba_load.write_atomic(path, text)  # same text: left alone, so Numba's cache stays valid
    assert path.stat().st_mtime_ns == before
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


# -- results ---------------------------------------------------------------------------


def _mm_cases(dtype):
    yield "odd", (rand(37, 29, dtype=dtype), rand(29, 53, dtype=dtype))
    yield "row", (rand(1, 5, dtype=dtype), rand(5, 64, dtype=dtype))
    yield "b_transposed", (rand(37, 29, dtype=dtype), rand(130, 29, dtype=dtype).t())
    yield "both_transposed", (rand(29, 37, dtype=dtype).t(), rand(130, 29, dtype=dtype).t())
    yield "sliced", (rand(40, 60, dtype=dtype)[::2, 3:32], rand(29, 300, dtype=dtype)[:, ::3])
    yield "k0", (rand(9, 0, dtype=dtype), rand(0, 70, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_matches_float64_reference(dtype):
    for name, tensors in _mm_cases(dtype):
        ki, outs = run_all(SMALL, "mm", tensors)
        assert len(outs) == len(GROUPS), name
        assert_matches(outs, reference("mm", tensors), ki)


def test_default_configs_on_a_small_problem():
    tensors = (rand(37, 29), rand(29, 53))
    ki, outs = run_all(NumbaMMTemplate(), "mm", tensors)
    assert len(outs) == len(NumbaMMTemplate().compile_configs(ki)) * len(GROUPS)
    assert_matches(outs, reference("mm", tensors), ki)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_group_gives_the_same_result(dtype):
    tensors = (rand(37, 29, dtype=dtype), rand(29, 200, dtype=dtype))  # 5 x 4 tiles of 8x64
    ki, outs = run_all(SMALL, "mm", tensors)
    first, *rest = outs.values()
    assert all(torch.equal(first, o) for o in rest)
    assert_matches(outs, reference("mm", tensors), ki)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bmm(dtype):
    cases = [
        (rand(3, 37, 29, dtype=dtype), rand(3, 29, 70, dtype=dtype)),
        (rand(3, 37, 29, dtype=dtype), rand(3, 70, 29, dtype=dtype).transpose(1, 2)),
        (rand(37, 29, dtype=dtype).expand(2, 37, 29), rand(2, 29, 70, dtype=dtype)),  # batch stride 0
    ]
    for tensors in cases:
        ki, outs = run_all(SMALL, "bmm", tensors)
        assert_matches(outs, reference("bmm", tensors), ki)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_shape", [(70,), (1, 70), (37, 1), (37, 70), ()])
def test_addmm_bias_alpha_beta(dtype, bias_shape):
    tensors = (rand(*bias_shape, dtype=dtype), rand(37, 29, dtype=dtype), rand(29, 70, dtype=dtype))
    ki, outs = run_all(SMALL, "addmm", tensors, alpha=0.5, beta=-2.0)
    assert_matches(outs, reference("addmm", tensors, 0.5, -2.0), ki)


@pytest.mark.parametrize("dtype", DTYPES)
def test_addmm_linear_layout(dtype):
    # nn.Linear: addmm(bias, x, weight.t()) with a 1-D bias and a transposed B.
    weight = rand(70, 29, dtype=dtype)
    tensors = (rand(70, dtype=dtype), rand(37, 29, dtype=dtype), weight.t())
    ki, outs = run_all(SMALL, "addmm", tensors)
    assert_matches(outs, reference("addmm", tensors), ki)
    torch.testing.assert_close(next(iter(outs.values())), torch.nn.functional.linear(tensors[1], weight, tensors[0]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_addmm_beta_zero_ignores_nan_bias(dtype):
    tensors = (torch.full((70,), float("nan"), dtype=dtype), rand(37, 29, dtype=dtype), rand(29, 70, dtype=dtype))
    ki, outs = run_all(SMALL, "addmm", tensors, alpha=2.0, beta=0.0)
    assert all(torch.isfinite(o).all() for o in outs.values())
    assert_matches(outs, 2.0 * (tensors[1].double() @ tensors[2].double()), ki)


def test_launcher_writes_into_out_or_allocates():
    a, b = rand(37, 29), rand(29, 70)
    ki = KernelInputs.from_tensors("mm", a, b)
    choice = SMALL.configs(ki)[0]
    launch = SMALL.compile(choice, ki, (a, b))
    out = torch.full(ki.out_size, float("nan"))
    res = launch((a, b), out, group=16)
    assert res is out
    fresh = launch((a, b))
    assert fresh.shape == ki.out_size and fresh.is_contiguous()
    assert torch.equal(out, fresh)


# -- one binary, runtime group ------------------------------------------------------


def test_group_is_a_runtime_argument_of_one_shared_binary():
    a, b = rand(37, 29), rand(29, 200)
    ki = KernelInputs.from_tensors("mm", a, b)
    choices = SMALL.configs(ki)
    assert len({c.binary_key for c in choices}) == 1 and len(choices) == len(GROUPS)
    c1, c16 = (next(c for c in choices if c.runtime_dict["group"] == g) for g in (1, 16))
    assert SMALL.kernel(c1) is SMALL.kernel(c16)
    kernel = SMALL.kernel(c1)
    l1, l16 = SMALL.compile(c1, ki, (a, b)), SMALL.compile(c16, ki, (a, b))
    n_before = len(kernel.signatures)
    assert torch.equal(l1((a, b), group=1), l16((a, b), group=16))
    assert len(kernel.signatures) == n_before  # no new specialisation for another group value
    f32 = [s for s in kernel.signatures if s[0].dtype == numba.float32]
    assert len(f32) == 1


def test_group_changes_the_tile_order():
    mod = cpu_numba.kernel_module({"BLOCK_M": 8, "BLOCK_N": 64, "BLOCK_K": 8})
    tiles_m, tiles_n = 5, 3
    orders = {g: [tuple(mod.tile_coords(p, tiles_m, tiles_n, g)) for p in range(tiles_m * tiles_n)] for g in GROUPS}
    every = sorted((m, n) for m in range(tiles_m) for n in range(tiles_n))
    assert all(sorted(o) == every for o in orders.values())  # each order visits every tile once
    assert orders[1] == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]  # row-major
    assert orders[16] == [(m, n) for n in range(tiles_n) for m in range(tiles_m)]  # column-major
    assert orders[4][:5] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]  # 4 row-tiles walked together
    assert len({tuple(o) for o in orders.values()}) == len(GROUPS)


def test_compile_leaves_numba_optimisation_settings_as_they_were():
    from numba.core.registry import cpu_target

    codegen = cpu_target.target_context.codegen()
    before = (getattr(codegen, "_loopvect", None), getattr(codegen, "_opt_level", None))
    a, b = rand(9, 9, dtype=torch.float64), rand(9, 9, dtype=torch.float64)
    ki = KernelInputs.from_tensors("mm", a, b)
    SMALL.compile(SMALL.configs(ki)[0], ki, (a, b))
    assert (getattr(codegen, "_loopvect", None), getattr(codegen, "_opt_level", None)) == before


NUMBA_CACHE_CHILD = textwrap.dedent("""
    import torch
    from gemmtune.core.inputs import KernelInputs
    from gemmtune.templates.cpu_numba import NumbaMMTemplate
    t = NumbaMMTemplate(space=[(8, 64, 8)])
    a, b = torch.randn(37, 29), torch.randn(29, 53)
    ki = KernelInputs.from_tensors("mm", a, b)
    c = t.configs(ki)[0]
    out = t.compile(c, ki, (a, b))((a, b), group=1)
    assert torch.allclose(out, a @ b, atol=1e-4)
    st = t.kernel(c).stats
    print(sum(st.cache_hits.values()), sum(st.cache_misses.values()))
""")
"""A new process compiling (or loading) one numba_mm config; prints its cache hits and misses."""


def test_a_new_process_loads_the_compiled_kernel_from_disk():
    a, b = rand(37, 29), rand(29, 53)
    ki = KernelInputs.from_tensors("mm", a, b)
    choice = SMALL.configs(ki)[0]
    SMALL.compile(choice, ki, (a, b))  # make sure this process compiled (and cached) it
    cache_root = Path(SMALL.kernel(choice).py_func.__code__.co_filename).parents[1]
    code = NUMBA_CACHE_CHILD
    src = str(Path(cpu_numba.__file__).resolve().parents[2])
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(cache_root),
           "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    hits, misses = map(int, proc.stdout.split()[-2:])
    assert hits >= 1 and misses == 0


def test_a_truncated_numba_cache_file_is_rebuilt_not_a_dropped_config(tmp_path):
    """A `.nbc` file cut short (a full disk, a killed process) made every later process fail that
    config with "UnpicklingError"; it is compiled again and the cache file written anew."""
    code = NUMBA_CACHE_CHILD
    src = str(Path(cpu_numba.__file__).resolve().parents[2])
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}

    def run() -> tuple[int, int]:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        hits, misses = map(int, proc.stdout.split()[-2:])
        return hits, misses

    run()  # compiles and writes the cache files
    cached = sorted((tmp_path / "numba" / "__pycache__").glob("*.nbc"))
    assert cached
    sizes = {p: p.stat().st_size for p in cached}
    for p in cached:
        p.write_bytes(p.read_bytes()[: sizes[p] // 3])
    run()  # loads the damaged files, then compiles again
    assert all(p.stat().st_size > sizes[p] // 3 for p in cached)  # written anew, whole
    assert run() == (1, 0)  # the rewritten files load: no compile


def test_numba_kernels_leave_torchs_thread_count_as_the_user_set_it(tmp_path):
    """Launching numba's OpenMP threading layer reset torch's intra-op threads (torch.set_num_threads(1)
    read 2 afterwards), so a job run with OMP_NUM_THREADS=1 per process got a thread per core in every
    process once gemmtune's numba kernels ran.  A fresh process: the layer is launched by the kernel."""
    script = textwrap.dedent("""
        import torch, numba
        torch.set_num_threads(1)
        from gemmtune.core.inputs import KernelInputs
        from gemmtune.templates.cpu_numba import NumbaMMTemplate
        t = NumbaMMTemplate(space=[(8, 64, 8)])
        a, b = torch.randn(20, 72), torch.randn(72, 90)
        ki = KernelInputs.from_tensors("mm", a, b)
        c = t.configs(ki)[0]
        t.compile(c, ki, (a, b))((a, b), **c.runtime_dict)
        print(torch.get_num_threads(), numba.get_num_threads())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "2", "NUMBA_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["1", "1"], done.stdout


@pytest.mark.parametrize("threads", [1, 2])
def test_a_launch_runs_numba_on_torchs_thread_count_and_the_result_holds(threads):
    """In a job of several processes on one host, each with OMP_NUM_THREADS=1, numba's loops used a
    thread per core in every process; now a launch follows torch's intra-op count (at most numba's)."""
    from gemmtune.core.choices import Choice

    prior = torch.get_num_threads()
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)  # first: it may launch the layer, which resets torch's
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(20, 72), torch.randn(72, 90)
        ki = KernelInputs.from_tensors("mm", a, b)
        choice = SMALL.configs(ki)[0]
        out = SMALL.compile(choice, ki, (a, b))((a, b), **choice.runtime_dict)
        assert numba.get_num_threads() == min(threads, numba.config.NUMBA_NUM_THREADS)
        torch.testing.assert_close(out.double(), reference("mm", (a, b)), rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(prior)
