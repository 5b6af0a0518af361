"""How precisely each fp8 kernel accumulates without fast accumulation: the relative error (Frobenius
norm, against the float64 product of the dequantised operands) of cuBLASLt (`torch._scaled_mm`) and of
every config of the two Triton fp8 templates with a float32 output, where the output's rounding is
negligible and the error is the accumulation's.  The Triton configs run with the tensor cores' partial
sums promoted to float32 every MAX_IMPRECISE elements of K (`--imprecise`, the templates' value first).

    python bench/fp8_accum_probe.py --out fp8_accum.json
    python bench/fp8_accum_probe.py --imprecise 128,64,32 --shapes 16x4096x1024
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))


# The persistent template's configs of tests/gpu/test_scaled_tma_gpu.py (its first failed the gate there).
TMA_SPACE = [dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, num_stages=4, num_warps=4),
             dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_stages=3, num_warps=8),
             dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=8),
             dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=256, num_stages=3, num_warps=4)]


def errors(shape, imprecise: list[int], rowwise: bool, configs: int) -> list[dict]:
    import torch
    from gemmtune.core.inputs import KernelInputs
    from gemmtune.measure.correctness import reference, tolerance
    from gemmtune.templates.triton import scaled_mm, scaled_tma
    from helpers import fp8_operands

    tensors = fp8_operands(*shape, rowwise, device="cuda")
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=torch.float32)
    ref = reference(ki, tensors)

    def rel(out: torch.Tensor) -> float:
        return float((out.double() - ref).norm() / ref.norm())

    rows = [dict(kernel="cublaslt", error=rel(torch._scaled_mm(*tensors, out_dtype=torch.float32)))]
    for value in imprecise:
        for module, template in ((scaled_mm, scaled_mm.TritonScaledMMTemplate()),
                                 (scaled_tma, scaled_tma.TritonScaledTMATemplate(space=TMA_SPACE))):
            module.MAX_IMPRECISE = value
            if not template.supports(ki):
                continue
            firsts = [c for c in template.configs(ki) if c.runtime_dict.get("swizzle", 1) == 1][:configs]
            for choice in firsts:
                try:
                    launch = template.compile(choice, ki, tensors)
                except Exception as exc:  # noqa: BLE001 - a config that does not fit: listed, not timed
                    rows.append(dict(kernel=choice.key, imprecise=value, error=None, failed=str(exc)[:120]))
                    continue
                rows.append(dict(kernel=choice.key, imprecise=value, error=rel(launch(tensors, None, **choice.runtime_dict))))
    for r in rows:
        r.update(shape="x".join(map(str, shape)), scales="rowwise" if rowwise else "tensorwise", tolerance=tolerance(ki))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1000x1024x512,16x4096x1024,1x512x272,512x8192x1024")
    p.add_argument("--imprecise", default="128,32")
    p.add_argument("--configs", type=int, default=6, help="configs of each template (its first ones)")
    p.add_argument("--out", default="fp8_accum_probe.json")
    args = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows = [r for s in shapes for r in errors(s, [int(v) for v in args.imprecise.split(",")], False, args.configs)]
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"{'shape':>16} {'kernel':<48} {'imprecise':>9} {'rel. error':>10} {'tolerance':>9}")
    for r in rows:
        err = "failed" if r["error"] is None else f"{r['error']:.2e}"
        print(f"{r['shape']:>16} {r['kernel']:<48} {str(r.get('imprecise', '-')):>9} {err:>10} {r['tolerance']:>9.0e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
