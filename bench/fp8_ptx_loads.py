"""The global loads of the fp8 kernel (`templates/triton/scaled_mm_kernel.py`) as Triton compiles it for
sm_90, counted by PTX instruction: no GPU needed (Triton compiles to PTX on the CPU).

Pointers and the ints a launch passes as multiples of 16 are specialised as the JIT does at run time
(`tt.divisibility` 16), and the unit strides are constants, as the JIT's `== 1` specialisation makes
them.  M is left unspecialised: an odd M.  A vector load (`ld.global.v2` or `v4`) needs its address
aligned to its width, so one at an index that is not (a wrapped edge row) faults with "misaligned
address".  `--rev REV` compiles the kernel file of a git revision instead, to compare.

    python bench/fp8_ptx_loads.py                      # the kernel as it is
    python bench/fp8_ptx_loads.py --rev HEAD~1 --block-m 256 --block-n 16
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
KERNEL = "src/gemmtune/templates/triton/scaled_mm_kernel.py"
COMMON = "src/gemmtune/templates/triton/common_kernel.py"
POINTERS = {"A": "*fp8e4nv", "B": "*fp8e4nv", "C": "*bf16", "SCALE_A": "*fp32", "SCALE_B": "*fp32", "BIAS": "*bf16"}
DIVISIBLE = ("N", "K", "stride_am", "stride_bn", "stride_cm")


def _source(rev: str | None, path: str) -> str:
    """A file of the working tree, or of git revision `rev`."""
    if rev is None:
        return (ROOT / path).read_text()
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def kernel_module(rev: str | None):
    """The kernel module of the working tree, or of git revision `rev`: the kernel file and the helpers it
    imports from `common_kernel.py` in one new module, built with Triton's interpreter off (as on a GPU)."""
    text = re.sub(r"(?m)^from \.common_kernel import .*$", "", _source(rev, KERNEL))
    path = Path(tempfile.mkdtemp()) / "fp8_kernel_probe.py"
    path.write_text(_source(rev, COMMON) + "\n\n" + text)
    spec = importlib.util.spec_from_file_location("fp8_kernel_probe", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    with interpreter_off():
        spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def interpreter_off():
    """TRITON_INTERPRET unset for the block (Triton reads it as it builds and compiles a kernel)."""
    interpret = os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret


def compiled(mod, cfg: dict[str, int], rowwise: bool = True, target: tuple[str, int, int] = ("cuda", 90, 32)):
    """The kernel of `mod` compiled by Triton for `target` (no GPU needed) at one config (BLOCK_M/N/K,
    num_stages, num_warps), specialised as the JIT specialises a launch on K, N and strides of 16."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = mod.scaled_mm_kernel
    names = kernel.arg_names
    const = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], ROWWISE=rowwise,
                 HAS_BIAS=False, EVEN_K=True, FAST_ACCUM=False, stride_ak=1, stride_bk=1, stride_cn=1)
    if "MAX_IMPRECISE" in names:
        const["MAX_IMPRECISE"] = min(cfg["BLOCK_K"], 128)
    signature = {n: "constexpr" if n in const else POINTERS.get(n, "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in POINTERS or n in DIVISIBLE}
    src = ASTSource(fn=kernel, signature=signature, constexprs={(names.index(n),): v for n, v in const.items()},
                    attrs=attrs)
    with interpreter_off():
        return triton.compile(src, target=GPUTarget(*target),
                              options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})


def loads(mod, block_m: int, block_n: int, block_k: int, rowwise: bool, warps: int, stages: int) -> dict[str, int]:
    """PTX global-load and async-copy instructions of the kernel at one config, by opcode."""
    cfg = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_stages=stages, num_warps=warps)
    ptx = compiled(mod, cfg, rowwise).asm["ptx"]
    return dict(collections.Counter(re.findall(r"(?:ld\.global|cp\.async\.cg)[.\w]*", ptx)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default=None, help="a git revision whose kernel file to compile (default: the working tree)")
    p.add_argument("--block-m", type=int, default=256)
    p.add_argument("--block-n", type=int, default=16)
    p.add_argument("--block-k", type=int, default=128)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--stages", type=int, default=5)
    p.add_argument("--tensorwise", action="store_true", help="tensor-wise scales (default: row-wise)")
    args = p.parse_args(argv)
    counts = loads(kernel_module(args.rev), args.block_m, args.block_n, args.block_k, not args.tensorwise,
                   args.warps, args.stages)
    print(json.dumps({"rev": args.rev or "working tree", "config": vars(args), "loads": counts}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
