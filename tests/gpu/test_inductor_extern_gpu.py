"""A CUTLASS pick inside a compiled graph, as gemmtune's extern kernel (`gemmtune.inductor.extern`);
skipped without CUDA, a Hopper GPU or nvidia-cutlass-operators.

Run:  python -m pytest -q -s tests/gpu/test_inductor_extern_gpu.py  (on the GPU machine:
`python bench/gpu_run.py cutlass-setup,tests-cutlass`, carrying .whl/cutlass)
"""

import pytest
import torch

import gemmtune
import gemmtune.inductor as gi
from gemmtune.inductor import extern
from gemmtune.templates.cutlass.operators import library_importable

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
pytestmark = pytest.mark.skipif(not (HOPPER and library_importable()),
                                reason="needs a Hopper GPU and nvidia-cutlass-operators")
CUTLASS = gemmtune.Settings(store="memory", backends=("cutlass",))


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    extern.STATS.clear()
    yield
    while gi.installer._PRIOR:
        gi.uninstall()
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs"])
def test_a_cutlass_pick_runs_in_the_compiled_graph_as_gemmtunes_kernel(mode):
    from torch._inductor.utils import run_and_get_code

    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 1536, device="cuda", dtype=torch.bfloat16)
    handler = gi.install(settings=CUTLASS, templates="all", measure="gemmtune")
    f = torch.compile(lambda a, b: torch.relu(a @ b), mode=mode, fullgraph=True)
    out, codes = run_and_get_code(f, x, w)
    code = "\n".join(codes)
    print(f"\n{mode}: built {handler.built}; stats {dict(extern.STATS)}")
    assert "extern_kernels.gemmtune_pick" in code and "cutlass_operators" in code
    torch.testing.assert_close(out, torch.relu(x.float() @ w.float()).bfloat16(), rtol=2e-2, atol=2e-1)
    assert extern.STATS["registered"] == 1 and extern.STATS["retuned"] == 0
    for _ in range(3):
        torch.testing.assert_close(f(x, w), out, rtol=0, atol=0)
    assert extern.STATS["calls"] >= 4
