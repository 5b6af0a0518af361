"""Host microseconds per call of one `nn.Linear` layer: plain, patched by gemmtune, and the pieces between.

The layer is small (the GPU never falls behind), so a loop of calls without a synchronize inside
measures what the host pays per call.  Variants, timed interleaved, best of `--repeat`:
- `plain`: the unpatched layer;  `patched`: `gemmtune.patch` with the input shape decided for F.linear;
- `closure`: an instance forward that calls `F.linear` on the parameter dict (a bare Python forward);
- `F.linear`: the functional call alone, no module.

    python bench/layer_host_cost.py --shape 1x1x64 --out layer_host_cost.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import timeit
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmtune  # noqa: E402


def variants(k: int, n: int, shape: tuple[int, ...], device: str, dtype: torch.dtype) -> dict:
    torch.manual_seed(0)
    plain = torch.nn.Linear(k, n, bias=False, device=device, dtype=dtype)
    patched = gemmtune.patch(copy.deepcopy(plain), backends=("extern",))
    closure = copy.deepcopy(plain)

    def bare(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        p = self.__dict__["_parameters"]
        return F.linear(x, p["weight"], p["bias"])

    closure.forward = types.MethodType(bare, closure)
    x = torch.randn(*shape, k, device=device, dtype=dtype)
    w = plain.weight
    return {"plain": lambda: plain(x), "patched": lambda: patched(x), "closure": lambda: closure(x),
            "F.linear": lambda: F.linear(x, w, None)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1x1x64", help="input shape and in-features, e.g. 1x1x64 (K last)")
    p.add_argument("--n", type=int, default=64, help="out-features")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--out", default="layer_host_cost.json")
    args = p.parse_args(argv)
    dims = tuple(int(v) for v in args.shape.split("x"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    fns = variants(dims[-1], args.n, dims[:-1], device, dtype)
    best: dict[str, float] = {}
    with torch.no_grad():
        for fn in fns.values():
            fn(), fn()
        for _ in range(args.repeat):
            for name, fn in fns.items():
                if device == "cuda":
                    torch.cuda.synchronize()
                us = timeit.timeit(fn, number=args.calls) / args.calls * 1e6
                best[name] = min(best.get(name, us), us)
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
    print(f"{meta['device']}, torch {meta['torch']}, python {meta['python']}; input {args.shape}, N={args.n}")
    print("| variant | host us per call | - plain |")
    print("|---|---|---|")
    for name, us in best.items():
        print(f"| {name} | {us:.3f} | {us - best['plain']:+.3f} |")
    Path(args.out).write_text(json.dumps({"meta": meta, "us": best}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
