"""Host instructions per eager forward, counted by valgrind: plain layers against gemmtune's patched ones.

A launch-bound eager forward is paced by the host, and on a shared machine its wall time moves by more
than a patched layer's cost (docs/MODELS.md).  Instruction counts do not: each variant runs in its own
process under `valgrind --tool=callgrind`, which counts only inside the timed loop (the loop runs under
`itertools.starmap`, and collection is toggled on `starmap_next`), so imports, tuning and the warm-up
are not counted.  Every problem is decided for torch's op (`backends=("extern",)` on CPU), the case of
a model whose warm-up kept torch's op everywhere.  Variants:
- `eager`: the model as built;  `eager_copy`: another copy (the A/A control);
- `eager_warmup`: `gemmtune.warmup(model, x, release=False)`, then the patched layers' warm path;
- `eager_warmup_release`: the same with `release=True`, the warm-up's default (the layers get the lean
  forward of `gemmtune.dispatch.release`).
Models: `tiny` (bench/models.py's two-layer stack, width 256) and `llama-tiny` (a two-layer
`transformers` Llama of width 64, where transformers is installed).  Needs valgrind; CPU only.

    python bench/host_instructions.py --model llama-tiny --out host_instructions.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("eager", "eager_copy", "eager_warmup", "eager_warmup_release")


def child(model_name: str, variant: str, calls: int) -> None:
    """Build the model, apply `variant`, run 20 forwards, then `calls` forwards under starmap."""
    import collections
    import copy
    import itertools

    import torch

    import gemmtune

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if model_name == "llama-tiny":
        from transformers import LlamaConfig, LlamaModel

        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                          num_hidden_layers=2, vocab_size=256, max_position_embeddings=64,
                          attn_implementation="sdpa", use_cache=False)
        base, inputs = LlamaModel(cfg).eval(), (torch.randint(0, 256, (1, 8)),)
    else:
        sys.path.insert(0, str(HERE))
        from models import build

        base, inputs = build("tiny", 8)
    model = copy.deepcopy(base)
    if variant.startswith("eager_warmup"):
        gemmtune.warmup(model, *inputs, backends=("extern",), progress=False,
                        release=variant == "eager_warmup_release")
    torch.set_grad_enabled(False)
    for _ in range(20):
        model(*inputs)
    collections.deque(itertools.starmap(model, itertools.repeat(inputs, calls)), maxlen=0)


def count(model_name: str, variant: str, calls: int, cache: str) -> int:
    """Instructions callgrind counted inside the loop of `child` for one variant, in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = {**os.environ, "GEMMTUNE_CACHE_DIR": cache, "PYTHONHASHSEED": "0",  # one dict layout per run
               "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=starmap_next",
               f"--callgrind-out-file={out}", sys.executable, __file__, "--child", model_name, variant, str(calls)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"{variant}: valgrind failed ({proc.returncode}): {proc.stderr[-2000:]}")
        found = re.search(r"^summary:\s*(\d+)", out.read_text(), re.M)
        if found is None:
            raise SystemExit(f"{variant}: no summary line in callgrind's output")
        return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("tiny", "llama-tiny"), default="llama-tiny")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--calls", type=int, default=100, help="forwards counted per variant")
    p.add_argument("--out", default="host_instructions.json")
    p.add_argument("--child", nargs=3, metavar=("MODEL", "VARIANT", "CALLS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        raise SystemExit(f"--variants: unknown {unknown or 'none given'}; known: {', '.join(VARIANTS)}")
    if args.calls < 1:
        raise SystemExit(f"--calls: must be >= 1, got {args.calls}")
    if shutil.which("valgrind") is None:
        raise SystemExit("host_instructions.py needs valgrind on the PATH")
    import torch

    with tempfile.TemporaryDirectory() as cache:
        per_call = {v: count(args.model, v, args.calls, cache) / args.calls for v in variants}
    ref = per_call.get("eager")
    rows = [{"variant": v, "instructions_per_forward": round(n), "x_eager": None if not ref else n / ref}
            for v, n in per_call.items()]
    meta = {"model": args.model, "calls": args.calls, "python": platform.python_version(), "torch": torch.__version__,
            "machine": platform.machine(), "command": " ".join(["python", "bench/host_instructions.py", *sys.argv[1:]])}
    print(f"{args.model}: host instructions per eager forward (callgrind), "
          f"python {meta['python']}, torch {meta['torch']}")
    print("| variant | instructions per forward | x eager |\n|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['instructions_per_forward']:,} | "
              f"{'-' if r['x_eager'] is None else format(r['x_eager'], '.4f')} |")
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
