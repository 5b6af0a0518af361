"""GPU fuzzing: random GEMM problems through every Triton binary and the library kernels.

Each case draws an op (mm / addmm / bmm), sizes (odd ones included), a dtype, operand layouts
(row-major, transposed, sliced with a step, expanded), a bias shape and alpha/beta, sometimes a
NaN or Inf in an operand.  Every choice of each Triton template that takes the problem (plain,
split-K forced on, persistent TMA, GEMV for M <= 4, one-launch split-K for M <= 256; a few configs fitted to the problem x every swizzle) and of the
library kernels runs on a NaN-poisoned output and is checked
against the float64 reference with `gemmtune.measure.correctness.check`.  A crash, a launch failure or a
wrong result is counted and reported with the case; the pass condition is 0 wrong results.

    python bench/fuzz_gpu.py --cases 1000 --jobs 12 --out fuzz.json          # on an H200
    TRITON_INTERPRET=1 python bench/fuzz_gpu.py --device cpu --cases 5 --max-dim 40   # smoke test

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter

import torch

from gemmtune.measure.correctness import check, reference
from gemmtune.core.inputs import KernelInputs
from gemmtune.templates.extern import AtenTemplate
from gemmtune.templates.triton.mm import TritonMMTemplate

LAYOUTS = ("row", "col", "sliced", "expanded")


def operand(lead, r, c, layout, dtype, device, rng):
    """An [.., r, c] tensor with the given stride pattern."""
    if layout == "col":
        return torch.randn(*lead, c, r, device=device).to(dtype).transpose(-1, -2)
    if layout == "sliced":
        return torch.randn(*lead, r, 2 * c + 1, device=device).to(dtype)[..., 1::2][..., :c]
    if layout == "expanded" and r > 1:
        return torch.randn(*lead, 1, c, device=device).to(dtype).expand(*lead, r, c)
    return torch.randn(*lead, r, c, device=device).to(dtype)


def draw(rng: random.Random, device: str, max_dim: int, dtypes):
    op = rng.choice(("mm", "mm", "addmm", "bmm"))
    dims = [rng.choice((1, 2, 3, 7, 16, 17, 31, 64, 100, 127, 128, 255, 257, 384, 511, 1000)) for _ in range(3)]
    M, K, N = (min(d, max_dim) for d in dims)
    batch = rng.randint(1, 4) if op == "bmm" else 1
    dtype = rng.choice(dtypes)
    lead = (batch,) if op == "bmm" else ()
    a = operand(lead, M, K, rng.choice(LAYOUTS), dtype, device, rng)
    b = operand(lead, K, N, rng.choice(LAYOUTS), dtype, device, rng)
    special = rng.random() < 0.15
    if special:
        a = a.clone()
        idx = tuple(rng.randrange(d) for d in a.shape)
        a[idx] = rng.choice((float("nan"), float("inf"), float("-inf")))
    alpha, beta = rng.choice((1.0, 0.5, -2.0)), rng.choice((1.0, 0.0, 1.5))
    if op == "addmm":
        bias = rng.choice((torch.randn(N), torch.randn(M, N), torch.randn(1, N), torch.randn(M, 1)))
        tensors = (bias.to(device=device, dtype=dtype), a, b)
    else:
        tensors, alpha, beta = (a, b), 1.0, 1.0
    return op, tensors, alpha, beta, special


def fuzz_templates(include_newer: bool = True, pool: int = 0, seed: int = 0):
    """The Triton templates under test: the plain one and (with `include_newer`) split-K, TMA, GEMV
    and one-launch split-K (`triton_skinny`).

    With `pool` > 0 each template keeps a fixed random sample of `pool` configs of its space, so the
    binaries compiled for one case serve the next ones (sizes and strides are runtime arguments).
    """
    from gemmtune.templates.triton.gemv import TritonGemvTemplate
    from gemmtune.templates.triton.skinny import TritonSkinnyTemplate
    from gemmtune.templates.triton.splitk import TritonSplitKTemplate
    from gemmtune.templates.triton.tma import TritonTMAPersistentTemplate

    classes = [(TritonMMTemplate, {})]
    if include_newer:
        classes += [(TritonSplitKTemplate, {"force": True}), (TritonTMAPersistentTemplate, {}), (TritonGemvTemplate, {}),
                    (TritonSkinnyTemplate, {})]
    templates = []
    for cls, kw in classes:
        space = cls().space
        if pool:
            space = random.Random(f"{seed}:{cls.uid}").sample(space, min(pool, len(space)))
        templates.append(cls(space=space, **kw))
    return templates


def run_case(op, tensors, alpha, beta, configs_per_case, templates=None):
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    ref = reference(ki, tensors)
    results = []
    extern = AtenTemplate(op)
    pairs = [(extern, c) for c in extern.configs(ki)]
    for template in templates if templates is not None else fuzz_templates():
        if not template.supports(ki):
            continue
        fitted = template.compile_configs(ki)
        pick = random.Random(f"{ki.problem_key}{template.uid}").sample(fitted, min(configs_per_case, len(fitted)))
        keep = {tuple(sorted(c.items())) for c in pick}
        pairs += [(template, c) for c in template.configs(ki) if c.config in keep]
    launchers = {}
    for template, c in pairs:
        try:
            launch = launchers.get(c.binary_key) or launchers.setdefault(c.binary_key, template.compile(c, ki, tensors))
            out = torch.full(ki.out_size, float("nan"), dtype=ki.dtype, device=tensors[-1].device)
            launch(tensors, out, **c.runtime_dict)
            if out.is_cuda:
                torch.cuda.synchronize()
            problem = check(ki, out, ref)
            results.append((c.template_uid, c.key, "wrong" if problem else "ok", problem or ""))
        except Exception as exc:  # noqa: BLE001 - a failure is a finding, the fuzz goes on
            results.append((c.template_uid, c.key, "error", f"{type(exc).__name__}: {str(exc)[:200]}"))
    return ki, results


def run_shard(args_tuple):
    """Cases i = shard, shard + shards, ... (each drawn from its own seeded RNG): counts and findings."""
    shard, shards, a = args_tuple
    torch.manual_seed(a["seed"] * 1000 + shard)
    templates = fuzz_templates(not a["plain_only"], a["pool"], a["seed"] * 1000 + shard)
    dtypes = ((torch.float16, torch.bfloat16, torch.float32) if a["device"].startswith("cuda")
              else (torch.float32, torch.float16))
    counts, findings, per_template = Counter(), [], Counter()
    for i in range(shard, a["cases"], shards):
        rng = random.Random(a["seed"] * 1_000_003 + i)
        op, tensors, alpha, beta, special = draw(rng, a["device"], a["max_dim"], dtypes)
        ki, results = run_case(op, tensors, alpha, beta, a["configs_per_case"], templates)
        counts["cases"] += 1
        counts["special"] += special
        for uid, key, status, detail in results:
            counts[status] += 1
            per_template[uid, status] += 1
            if status != "ok":
                findings.append({"case": i, "problem": ki.to_dict(), "choice": key, "status": status, "detail": detail})
        if counts["cases"] % 50 == 0:
            print(f"shard {shard}: {counts['cases']} cases, {counts['wrong']} wrong, {counts['error']} errors", flush=True)
    return counts, findings, per_template


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-dim", type=int, default=1000)
    p.add_argument("--configs-per-case", type=int, default=3, help="configs per template per case (x every swizzle)")
    p.add_argument("--pool", type=int, default=6, help="configs each template samples once per shard (0: whole space)")
    p.add_argument("--jobs", type=int, default=1, help="processes, each with its own shard of the cases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="fuzz_gpu.json")
    p.add_argument("--plain-only", action="store_true", help="fuzz only the plain Triton template (no split-K, TMA, GEMV)")
    args = p.parse_args()
    a = vars(args)
    t0 = time.perf_counter()
    jobs = [(j, args.jobs, a) for j in range(args.jobs)]
    if args.jobs == 1:
        parts = [run_shard(jobs[0])]
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            parts = pool.map(run_shard, jobs)
    counts, findings, per_template = Counter(), [], Counter()
    for c, f, pt in parts:
        counts.update(c)
        findings += f
        per_template.update(pt)
    findings.sort(key=lambda f: f["case"])
    counts["seconds"] = round(time.perf_counter() - t0, 1)
    print("| cases | with NaN/Inf | results | ok | wrong | errors | seconds |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {counts['cases']} | {counts['special']} | {counts['ok'] + counts['wrong'] + counts['error']} | "
          f"{counts['ok']} | {counts['wrong']} | {counts['error']} | {counts['seconds']} |")
    for (uid, status), n in sorted(per_template.items()):
        print(f"  {uid}: {n} {status}")
    for f in findings[:20]:
        print(f"  case {f['case']}: {f['choice']} {f['status']}: {f['detail']}")
    with open(args.out, "w") as fh:
        json.dump({"device": args.device, "counts": dict(counts), "findings": findings,
                   "per_template": {f"{u}:{s}": n for (u, s), n in per_template.items()},
                   "torch": torch.__version__, "command": " ".join(sys.argv)}, fh, indent=1, default=str)
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
