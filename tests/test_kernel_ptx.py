"""What the mm kernel compiles to on an H100 (sm_90), checked without a GPU: Triton builds the PTX on a
CPU machine (its ptxas ships in the wheel).  A narrow output whose N is not a multiple of 16 (MobileNet's
and EfficientNet's N = 24 and 72 projections) is stored in 128-bit vectors once the kernel is told its
rows' alignment (`stride_divisors`' DIV_CM); told nothing, every element is its own 16-bit store."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

SRC = Path(__file__).resolve().parents[1] / "src"

# A fresh process: the interpreter other tests run patches triton.language for the whole process.  The
# kernel's arguments are those its launcher builds for the problem (`launch_spec`), specialised as Triton
# specialises a launch's: a pointer 16-byte aligned, an integer of 1 a constant, one divisible by 16 so marked.
COMPILE = """
import json, re, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.triton.mm import TritonMMTemplate

def stores(M, N, K, div_cm):
    a, b = torch.zeros(M, K, dtype=torch.bfloat16), torch.zeros(K, N, dtype=torch.bfloat16)
    ki = KernelInputs.from_tensors("mm", a, b)
    t = TritonMMTemplate(space=[dict(BLOCK_M=128, BLOCK_N=32, BLOCK_K=32, num_stages=3, num_warps=4)])
    run, args = t.launch_spec(t.configs(ki)[0], ki)
    every = dict(run.meta, **({} if div_cm is None else {"DIV_CM": div_cm}))
    meta = {k: v for k, v in every.items() if k in run.kernel.arg_names}  # the rest: launch options
    values = args((a, b), torch.empty(M, N, dtype=torch.bfloat16))
    names = [n for n in run.kernel.arg_names if n not in meta]
    sig, const, attrs = {}, dict(meta), {}
    for i, (name, v) in enumerate(zip(names, values)):
        at = run.kernel.arg_names.index(name)
        if isinstance(v, torch.Tensor) or v is None:
            sig[name], attrs[(at,)] = "*bf16", [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[name] = "fp32"
        elif v == 1:
            sig[name], const[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if v % 16 == 0:
                attrs[(at,)] = [["tt.divisibility", 16]]
    sig.update({n: "constexpr" for n in meta})
    kernel = triton.compile(ASTSource(run.kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=every["num_warps"], num_stages=every["num_stages"]))
    found = re.findall(r"st\\.global[.\\w]*", kernel.asm["ptx"])
    return {s: found.count(s) for s in set(found)}

print(json.dumps([stores(*case) for case in json.loads(sys.argv[1])]))
"""


def _stores(cases, cache):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(SRC)
    env["TRITON_CACHE_DIR"] = str(cache)
    done = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(cases)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_narrow_output_is_stored_in_128_bit_vectors(tmp_path):
    told, untold_24, sixteen = _stores([[4096, 24, 144, None], [4096, 24, 144, 1], [4096, 16, 256, None]], tmp_path)
    assert set(told) == {"st.global.v4.b32"}  # N = 24: 8 bf16 per store
    assert set(untold_24) == {"st.global.b16"}  # the same kernel told nothing: one element per store
    assert set(sixteen) == {"st.global.v4.b32"}  # N = 16 Triton knew from its own specialisation
