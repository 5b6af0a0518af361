"""Registers, spilled bytes, shared memory and compile time of the fp8 kernel's configs as Triton compiles
them for sm_90 on this machine (no GPU needed), and, given a sweep, how the configs that spill ranked there.

Each config is compiled as `fp8_ptx_loads.compiled` specialises a launch (unit strides constant, K, N and
the other strides multiples of 16); `cuobjdump --dump-resource-usage` (Triton's own copy) reads the
registers and the stack (spilled) bytes of the cubin.  Compiles go to a new Triton cache, so their
seconds are cold compiles on this machine's CPU.  The result depends on the Triton (and its ptxas)
that compiles: put the GPU machine's Triton first on `PYTHONPATH` to match its binaries.

    python bench/fp8_resources.py --space narrow                          # the narrow configs
    python bench/fp8_resources.py --sweep src/gemmtune/data/sweep_h200_fp8.jsonl.gz --json out.json

With `--sweep`, the configs compiled are the distinct (config, scale kind) pairs the sweep timed, and the
report adds, over its shapes: how many times a spilling config was the best Triton config by GPU time,
the regret of the best config that does not spill, and the share of the sweep's compile time the
spilling configs took.  CPU only; prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_ptx_loads import compiled, kernel_module  # noqa: E402

TEMPLATE = "triton_scaled_mm"
TILE = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")


def config_key(cfg: dict[str, int], rowwise: bool) -> str:
    """`64x16x256 s5 w4 rowwise`."""
    return (f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} s{cfg['num_stages']} w{cfg['num_warps']} "
            f"{'rowwise' if rowwise else 'tensorwise'}")


def usage(cubin: bytes) -> dict[str, int]:
    """REG and STACK of a cubin, read by the cuobjdump that ships with Triton."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    found = {k: re.search(rf"{k}:(\d+)", text) for k in ("REG", "STACK")}
    if not all(found.values()):
        raise RuntimeError(f"cuobjdump printed no REG/STACK: {text[-300:]!r}")
    return {k.lower(): int(m.group(1)) for k, m in found.items() if m}


def resources(mod, cfg: dict[str, int], rowwise: bool) -> dict:
    """One config's compile seconds, shared-memory bytes, registers and stack (spilled) bytes."""
    start = time.perf_counter()
    kernel = compiled(mod, cfg, rowwise)
    seconds = time.perf_counter() - start
    return dict(config=config_key(cfg, rowwise), **{k: cfg[k] for k in TILE}, rowwise=rowwise,
                compile_s=round(seconds, 3), shared=kernel.metadata.shared, **usage(kernel.asm["cubin"]))


def space(name: str) -> list[dict[str, int]]:
    """A named config list of the template: a `config_space` size, `skinny` or `narrow`."""
    from gemmtune.templates.triton import scaled_mm

    if name == "skinny":
        return scaled_mm.skinny_space()
    if name == "narrow":
        return scaled_mm.narrow_space()
    return scaled_mm.config_space(name)


def sweep_shapes(path: Path) -> list[dict]:
    """The sweep's shapes, each with {config: (best GPU ms over its swizzles, compile s)} of the template."""
    from gemmtune.offline.dataset import read_lines

    shapes = []
    for line in read_lines(path):
        if line.get("type") != "shape":
            continue
        rowwise = line.get("scales") == "rowwise"
        best: dict[tuple, list[float]] = {}
        for c in line["choices"]:
            if c["template"] != TEMPLATE or c.get("status") != "ok" or c.get("gpu_ms") is None:
                continue
            key = (tuple(c["config"][k] for k in TILE), rowwise)
            ms, comp = best.get(key, [float("inf"), 0.0])
            best[key] = [min(ms, c["gpu_ms"]), max(comp, c.get("compile_s") or 0.0)]
        shapes.append(dict(name=line["name"], configs=best))
    return shapes


def sweep_report(shapes: list[dict], rows: dict[tuple, dict]) -> dict:
    """Over the sweep's shapes: where the best config spilled, and what dropping the spilling ones costs."""
    per_shape, spill_s, total_s = [], 0.0, 0.0
    for shape in shapes:
        timed = shape["configs"]
        spills = {k for k in timed if rows[k].get("stack", 0) > 0}
        best = min(ms for ms, _ in timed.values())
        clean = min((ms for k, (ms, _) in timed.items() if k not in spills), default=float("inf"))
        top = min(timed, key=lambda k: timed[k][0])
        spill_s += sum(timed[k][1] for k in spills)
        total_s += sum(c for _, c in timed.values())
        per_shape.append(dict(shape=shape["name"], configs=len(timed), spilling=len(spills),
                              best=rows[top]["config"], best_spills=top in spills,
                              regret_without_spilling_pct=round(100 * (clean / best - 1), 2)))
    return dict(shapes=per_shape, best_spills=sum(s["best_spills"] for s in per_shape),
                max_regret_without_spilling_pct=max((s["regret_without_spilling_pct"] for s in per_shape), default=0.0),
                spilling_compile_share=round(spill_s / total_s, 3) if total_s else 0.0)


def compile_all(mod, pairs: list[tuple[dict[str, int], bool]]) -> list[dict]:
    """`resources` of every (config, rowwise) pair; a config that fails to compile gets its error."""
    rows = []
    for cfg, rowwise in pairs:
        try:
            rows.append(resources(mod, cfg, rowwise))
        except Exception as exc:  # a config Triton refuses is a finding, not a stop
            rows.append(dict(config=config_key(cfg, rowwise), **cfg, rowwise=rowwise, error=repr(exc)[:300]))
    return rows


def summary(rows: list[dict]) -> dict:
    """Counts over the compiled configs: errors, spilling ones, compile seconds."""
    ok = [r for r in rows if "error" not in r]
    seconds = [r["compile_s"] for r in ok]
    return dict(configs=len(rows), errors=len(rows) - len(ok), spilling=sum(r["stack"] > 0 for r in ok),
                max_regs=max((r["reg"] for r in ok), default=0), max_shared=max((r["shared"] for r in ok), default=0),
                compile_s_median=statistics.median(seconds) if seconds else 0.0, compile_s_max=max(seconds, default=0.0))


def table(rows: list[dict]) -> str:
    """One line per config."""
    lines = [f"{'config':<34} {'compile s':>9} {'shared':>7} {'regs':>5} {'spill B':>7}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['config']:<34} error: {r['error'][:60]}")
        else:
            lines.append(f"{r['config']:<34} {r['compile_s']:>9.2f} {r['shared']:>7} {r['reg']:>5} {r['stack']:>7}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--space", default="narrow", help="default, max, skinny or narrow (ignored with --sweep)")
    p.add_argument("--tensorwise", action="store_true", help="tensor-wise scales (default: row-wise)")
    p.add_argument("--sweep", type=Path, default=None, help="a gemmtune sweep dataset (.jsonl or .jsonl.gz)")
    p.add_argument("--rev", default=None, help="a git revision whose kernel file to compile")
    p.add_argument("--json", type=Path, default=None, help="write the rows and the summary here")
    args = p.parse_args(argv)
    if args.sweep is not None and not args.sweep.is_file():
        print(f"fp8_resources: no sweep dataset at {args.sweep}", file=sys.stderr)
        return 2
    shapes = sweep_shapes(args.sweep) if args.sweep else []
    pairs = (sorted({k for s in shapes for k in s["configs"]}) if args.sweep
             else [(tuple(c[k] for k in TILE), not args.tensorwise) for c in space(args.space)])
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fp8_resources_")  # cold compiles, timed
    rows = compile_all(kernel_module(args.rev), [(dict(zip(TILE, t)), rw) for t, rw in pairs])
    import triton

    result = dict(triton=triton.__version__, target="sm_90", summary=summary(rows), rows=rows)
    if shapes:
        result["sweep"] = dict(path=str(args.sweep), **sweep_report(shapes, dict(zip(pairs, rows))))
    print(table(rows))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
