"""What a CUTLASS pick costs per call inside a compiled graph, as gemmtune's extern kernel.

For each shape, one compile per variant of the same GEMM (`torch.compile`, default mode):
- `extern`: `gemmtune.inductor.install(templates="all", measure="gemmtune")`: the pick of gemmtune's
  full pool; a CUTLASS pick is called as `extern_kernels.gemmtune_pick` (`inductor.extern`);
- `default`: a plain `torch.compile` (cuBLAS through `extern_kernels.mm`);
and `torch.mm` called directly.  All timed interleaved with gemmtune's CUDA timer (GPU ms, L2
evicted, and host ms per call); the JSON keeps what each compile built.

Run (H200 with nvidia-cutlass-operators): `python bench/gpu_run.py extern-cutlass`, or
`python bench/extern_call.py --only square-8192,odd-4097 --out extern.json`.  `--dry-run` prints the
plan without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import load_specs, op_fn  # noqa: E402

DEFAULT_SHAPES = "square-8192,odd-4097,square-4096"


def compile_variant(spec, tensors, settings, extern: bool) -> tuple[Any, dict[str, Any]]:
    """A default-mode compile of the shape's op (with gemmtune's handler when `extern`); what it built."""
    import torch

    import gemmtune.inductor as gi

    torch._dynamo.reset()
    fn = op_fn(spec.op)
    f = torch.compile(lambda *xs: fn(*xs), fullgraph=True)
    t0 = time.perf_counter()
    if extern:
        with gi.installed(settings=settings, templates="all", measure="gemmtune") as handler:
            f(*tensors)
        built = [uid for _, uid, _ in handler.built]
        picks = sorted({p.source for p in handler.picks.values()})
    else:
        f(*tensors)
        built, picks = ["(Inductor's own)"], []
    torch.cuda.synchronize()
    return f, {"compile_s": time.perf_counter() - t0, "built": built, "picks": picks}


def run_shape(spec, settings, timer, rounds: int) -> dict[str, Any]:
    import torch

    from gemmtune.inductor import extern

    tensors = spec.tensors("cuda")
    row: dict[str, Any] = {"name": spec.name, "problem": spec.describe()}
    fns = {"torch": lambda: op_fn(spec.op)(*tensors)}
    for name, is_extern in (("extern", True), ("default", False)):
        f, facts = compile_variant(spec, tensors, settings, is_extern)
        row.update({f"{name}_{k}": v for k, v in facts.items()})
        fns[name] = (lambda f: lambda: f(*tensors))(f)
    row["extern_used"] = extern.EXTERN_UID in row["extern_built"]
    ref = fns["torch"]()
    row["max_abs_err"] = float((fns["extern"]() - ref).abs().max())
    for name, m in zip(fns, timer.time_interleaved(list(fns.values()), rounds)):
        row[f"{name}_ms"], row[f"{name}_host_ms"] = m.cost_ms, m.host_ms
    row["extern_vs_default"] = row["default_ms"] / row["extern_ms"]
    del tensors
    torch.cuda.empty_cache()
    return row


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default=str(Path(__file__).with_name("shapes.json")))
    p.add_argument("--only", default=DEFAULT_SHAPES, help="comma-separated shape names of the suite")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default="", help="JSON file to write (rows, rewritten after each shape)")
    p.add_argument("--dry-run", action="store_true", help="print the shapes and variants; no GPU needed")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    specs = load_specs(args.suite, [s for s in args.only.split(",") if s])
    if args.dry_run:
        for s in specs:
            print(f"{s.name}: {s.describe()}: extern (install templates='all', measure='gemmtune'), default, torch")
        return 0
    import torch

    import gemmtune
    from gemmtune.core.settings import Settings
    from gemmtune.measure.timers import CudaTimer

    if not torch.cuda.is_available():
        raise SystemExit("extern_call.py measures on a CUDA GPU; use --dry-run elsewhere")
    settings = Settings.from_env().with_(store="memory")
    timer = CudaTimer(torch.device("cuda"), rep_ms=50, count_host=False, flush=settings.l2_flush)
    meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "gemmtune": gemmtune.__version__, "command": " ".join(sys.argv),
            "timing": "GPU ms by CUDA events (L2 evicted), interleaved; *_host_ms: host time per call"}
    rows = []
    for spec in specs:
        row = run_shape(spec, settings, timer, args.rounds)
        rows.append(row)
        print(f"{spec.name}: built {row['extern_built']} (extern: {row['extern_used']}); ms extern "
              f"{row['extern_ms']:.4f} default {row['default_ms']:.4f} torch {row['torch_ms']:.4f}; host us extern "
              f"{1e3 * row['extern_host_ms']:.1f} default {1e3 * row['default_host_ms']:.1f} torch "
              f"{1e3 * row['torch_host_ms']:.1f}; x{row['extern_vs_default']:.3f}", flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
