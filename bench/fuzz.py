"""Random GEMM problems through every kernel gemmtune tunes among, on a NaN-poisoned output, each checked
against a float64 reference with the correctness gate's check; 0 wrong results, errors and mismatches pass.

`--kind mm`: mm, addmm and bmm (odd sizes, four layouts, three dtypes, broadcast biases, alpha, beta, NaN,
Inf) through the library kernel and each Triton template that takes the problem (sampled configs x every
swizzle).  `--kind fp8`: `torch._scaled_mm` problems (scale kinds, dtypes, biases, fast accumulation, NaN,
Inf; now and then a call torch refuses) through the pool, `gemmtune.scaled_mm` and torch: gemmtune must
refuse what torch refuses (on CPU, torch's verdict is `cuda_rules`).  Exit status 1 on a finding.

    python bench/fuzz.py --kind mm --cases 1000 --jobs 12 --out fuzz_mm.json          # a GPU
    python bench/fuzz.py --kind fp8 --cases 200 --out fuzz_fp8.json                    # a GPU, cc >= 8.9
    TRITON_INTERPRET=1 python bench/fuzz.py --kind fp8 --device cpu --cases 20 --max-dim 48
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import random
import re
import sys
import time
from collections import Counter, namedtuple
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

E4M3, E5M2, BF16, F16, F32 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16, torch.float32
DTYPES = {"e4m3": E4M3, "e5m2": E5M2, "bf16": BF16, "fp16": F16, "fp32": F32}
EDGES = (1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 511, 512, 1000, 1024)
SMALL_SPACE = (dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_stages=2, num_warps=4),
               dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, num_stages=2, num_warps=4))
TORCH_REFUSALS = (RuntimeError, ValueError, TypeError, NotImplementedError)
PROBES = ("odd K", "odd N", "mixed scales", "two e5m2", "row-major b", "bias of another dtype",
          "bias with float32 out", "row-wise without bf16 out")
COLUMNS = ("cases", "refused, as torch", "computed", "kernels run", "wrong", "mismatch", "error", "torch wrong",
           "differs from torch")
MM_COLUMNS = ("cases", "with NaN/Inf", "kernels run", "ok", "wrong", "error")


@dataclass
class Tally:
    """Counts and findings (each a dict naming the case, what ran and what went wrong)."""

    counts: Counter = field(default_factory=Counter)
    per_kernel: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)  # gemmtune's refusals agreeing with torch, by rule
    started: float = field(default_factory=time.perf_counter)
    findings: list[dict[str, Any]] = field(default_factory=list)

    def add(self, index: int, problem: str, kind: str, what: str, detail: str) -> None:
        self.counts[kind] += 1
        self.findings.append({"case": index, "problem": problem, "kind": kind, "what": what, "detail": detail[:300]})

    def merge(self, other: "Tally") -> "Tally":
        self.counts.update(other.counts)
        self.per_kernel.update(other.per_kernel)
        self.findings = sorted(self.findings + other.findings, key=lambda f: f["case"])
        return self

    def passed(self) -> bool:
        return not (self.counts["wrong"] or self.counts["mismatch"] or self.counts["error"])


def mm_operand(lead: tuple, r: int, c: int, layout: str, dtype: torch.dtype, device: str) -> torch.Tensor:
    """An [.., r, c] tensor: row-major, transposed ("col"), every other column ("sliced") or one row expanded."""
    x = torch.randn(*lead, *{"col": (c, r), "sliced": (r, 2 * c + 1), "expanded": (1, c)}.get(layout, (r, c)),
                    device=device).to(dtype)
    return {"col": lambda: x.transpose(-1, -2), "sliced": lambda: x[..., 1::2][..., :c],
            "expanded": lambda: x.expand(*lead, r, c)}.get(layout, lambda: x)()


def mm_draw(rng: random.Random, device: str, max_dim: int, dtypes: Sequence[torch.dtype]) -> tuple:
    """(op, tensors, alpha, beta, special): one random problem."""
    op = rng.choice(("mm", "mm", "addmm", "bmm"))
    M, K, N = (min(rng.choice((1, 2, 3, 7, 16, 17, 31, 64, 100, 127, 128, 255, 257, 384, 511, 1000)), max_dim)
               for _ in range(3))
    dtype, lead = rng.choice(dtypes), ((rng.randint(1, 4),) if op == "bmm" else ())
    a, b = (mm_operand(lead, r, c, rng.choice(("row", "col", "sliced", "expanded")), dtype, device)
            for r, c in ((M, K), (K, N)))
    if special := rng.random() < 0.15:
        a = a.clone()
        a[tuple(rng.randrange(d) for d in a.shape)] = rng.choice((float("nan"), float("inf"), float("-inf")))
    alpha, beta = rng.choice((1.0, 0.5, -2.0)), rng.choice((1.0, 0.0, 1.5))
    if op != "addmm":
        return op, (a, b), 1.0, 1.0, special
    bias = rng.choice((torch.randn(N), torch.randn(M, N), torch.randn(1, N), torch.randn(M, 1)))
    return op, (bias.to(device=device, dtype=dtype), a, b), alpha, beta, special


def mm_templates(pool: int, seed: int) -> list[Any]:
    """The Triton templates, each with a seeded sample of `pool` configs (0: all): binaries serve many cases."""
    from gemmtune.templates.triton import gemv, mm, skinny, splitk, tma
    kinds = (mm.TritonMMTemplate, splitk.TritonSplitKTemplate, tma.TritonTMAPersistentTemplate, gemv.TritonGemvTemplate,
             skinny.TritonSkinnyTemplate)
    spaces = {cls: cls().space for cls in kinds}
    return [cls(space=random.Random(f"{seed}:{cls.uid}").sample(s, min(pool, len(s))) if pool else s,
                **({"force": True} if cls is splitk.TritonSplitKTemplate else {})) for cls, s in spaces.items()]


def mm_shard(job: tuple[int, int, dict[str, Any]]) -> Tally:
    """Cases shard, shard + shards, ... (each from its own seeded RNG) through the library and sampled configs."""
    from gemmtune.core.inputs import KernelInputs
    from gemmtune.measure.correctness import reference
    from gemmtune.templates.extern import AtenTemplate
    shard, shards, a = job
    torch.manual_seed(a["seed"] * 1000 + shard)
    templates, tally = mm_templates(a["configs"], a["seed"] * 1000 + shard), Tally()
    for i in range(shard, a["cases"], shards):
        rng = random.Random(a["seed"] * 1_000_003 + i)
        op, tensors, alpha, beta, special = mm_draw(rng, a["device"], a["max_dim"],
                                                    (F16, BF16, F32) if a["device"] == "cuda" else (F32, F16))
        ki, extern = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta), AtenTemplate(op)
        choices = list(extern.configs(ki))
        for t in (t for t in templates if t.supports(ki)):
            fitted = t.compile_configs(ki)
            keep = {tuple(sorted(c.items())) for c in random.Random(f"{ki.problem_key}{t.uid}").sample(
                fitted, min(a["configs_per_case"], len(fitted)))}
            choices += [c for c in t.configs(ki) if c.config in keep]
        tally.counts["cases"] += 1
        tally.counts["with NaN/Inf"] += special
        run_choices(ki, tensors, reference(ki, tensors), [extern, *templates], choices, (i, ki.describe()), tally)
    return tally


def run_choices(ki: Any, tensors: Sequence[torch.Tensor], ref: torch.Tensor, templates: Sequence[Any],
                choices: Sequence[Any], note: tuple[int, str], tally: Tally) -> None:
    """Every choice compiled, run on a NaN-poisoned output and checked against `ref`: ok, wrong or error."""
    from gemmtune.measure.compile import precompile
    from gemmtune.measure.correctness import check
    built = precompile(choices, {t.uid: t for t in templates}, ki, tensors, timeout_s=300)
    for c in choices:
        tally.counts["kernels run"] += 1
        launch, status, detail = built.launcher(c), "ok", ""
        try:
            if launch is None:
                raise RuntimeError(f"compile: {built.failures.get(c.binary_key)}")
            out = torch.full(ki.out_size, float("nan"), dtype=ki.result_dtype, device=tensors[0].device)
            launch(tensors, out, **c.runtime_dict)
            if problem := check(ki, out, ref):
                status, detail = "wrong", problem
        except Exception as exc:  # noqa: BLE001 - a failing kernel is a finding; the fuzz goes on
            status, detail = "error", f"{type(exc).__name__}: {exc}"
        tally.per_kernel[c.template_uid, status] += 1
        if status == "ok":
            tally.counts["ok"] += 1
        else:
            tally.add(*note, status, c.name, detail)


class Case(namedtuple("Case", "index M K N scales a_dtype b_dtype out_dtype bias bias_step fast_accum b_layout "
                            "seed probe special", defaults=("", ""))):
    """One fp8 problem ("mixed" scales: scale_a tensor-wise, scale_b row-wise; `bias` "" or its dtype,
    `bias_step` 2 a strided view; `probe` the refusal it probes; `special` "nan" or "inf" in A)."""

    def describe(self) -> str:
        bias = f" bias {self.bias}" + ("/step 2" if self.bias_step > 1 else "") if self.bias else ""
        return (f"{self.M}x{self.K}x{self.N} {self.scales} {self.a_dtype}x{self.b_dtype}->{self.out_dtype}{bias}"
                f"{' fast' if self.fast_accum else ''}{' b row-major' if self.b_layout == 'row' else ''}"
                f"{' ' + self.special + ' in a' if self.special else ''}")


def _dim(rng: random.Random, max_dim: int, multiple_of_16: bool | None) -> int:
    """A size up to `max_dim`, half the time an edge of `EDGES`: any (None), a multiple of 16 or not one."""
    d = rng.choice([e for e in EDGES if e <= max_dim]) if rng.random() < 0.5 else rng.randint(1, max_dim)
    if multiple_of_16 is None or (not multiple_of_16 and d % 16):
        return d
    return max(16, d // 16 * 16) if multiple_of_16 else d + rng.choice((-1, 1))


def draw(rng: random.Random, index: int, max_dim: int, probes: float = 0.3, e4m3_nan: bool = True) -> Case:
    """One case: with probability `probes` a call torch refuses (`PROBES`), else one every GPU takes.
    `e4m3_nan` False: no NaN in an e4m3 A (the interpreter reads it as 480); the draws stay the same."""
    u = rng.random()
    M = 0 if u < 0.02 else rng.randint(1, 4) if u < 0.15 else _dim(rng, max_dim, None)
    probe = rng.choice(PROBES) if rng.random() < probes else ""
    K, N = _dim(rng, max_dim, probe != "odd K"), _dim(rng, max_dim, probe != "odd N")
    scales = "mixed" if probe == "mixed scales" else rng.choice(("tensorwise", "rowwise"))
    a = rng.choices(("e4m3", "e5m2"), (0.7, 0.3))[0]
    b = "e5m2" if probe == "two e5m2" or (a == "e4m3" and rng.random() < 0.15) else "e4m3"
    a = "e5m2" if probe == "two e5m2" else a
    out = "bf16" if scales == "rowwise" else rng.choices(("bf16", "fp16", "fp32"), (0.7, 0.15, 0.15))[0]
    out = rng.choice(("fp16", "fp32")) if probe == "row-wise without bf16 out" else out
    scales = "rowwise" if probe == "row-wise without bf16 out" else scales
    bias = ("" if out == "fp32" else out) if rng.random() < 0.5 else ""
    if probe == "bias of another dtype":
        out = rng.choice(("bf16", "fp16"))
        bias = rng.choice([d for d in ("bf16", "fp16", "fp32") if d != out])
    bias = "bf16" if probe == "bias with float32 out" else bias
    out = "fp32" if probe == "bias with float32 out" else out
    special = rng.choice(("nan", "inf") if a == "e5m2" else ("nan",)) if M and rng.random() < 0.06 else ""
    special = "" if probe or (a == "e4m3" and not e4m3_nan) else special
    return Case(index, M, K, N, scales, a, b, out, bias, 2 if bias and rng.random() < 0.15 else 1,
                rng.random() < 0.5, "row" if probe == "row-major b" else "col", rng.getrandbits(31), probe, special)


def _quantise(x: torch.Tensor, dtype: torch.dtype, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from gemmtune.offline.fp8_spec import quantise
    if x.numel() == 0:  # amax of nothing: unit scales
        return x.to(dtype), torch.ones(x.shape[0], 1) if rowwise else torch.ones(())
    return quantise(x, dtype, rowwise)


def operands(case: Case, device: str) -> tuple[torch.Tensor, ...]:
    """(a, b, scale_a, scale_b[, bias]): rows scaled by 2**U(-3, 3), quantised as torchao does."""
    g = torch.Generator().manual_seed(case.seed)

    def rows(r: int) -> torch.Tensor:
        return torch.randn(r, case.K, generator=g) * 2.0 ** (torch.rand(r, 1, generator=g) * 6 - 3)

    a, sa = _quantise(rows(case.M), DTYPES[case.a_dtype], case.scales == "rowwise")
    if case.special:  # NaN and Inf are data: they reach the output where the reference has them
        a[tuple(int(torch.randint(n, (), generator=g)) for n in a.shape)] = float(case.special)
    w, sw = _quantise(rows(case.N), DTYPES[case.b_dtype], case.scales != "tensorwise")
    b = w.to(device).t() if case.b_layout == "col" else w.t().contiguous().to(device)
    tensors = [a.to(device), b, sa.to(device), (sw.t().contiguous() if case.scales != "tensorwise" else sw).to(device)]
    if case.bias:
        full = torch.randn(case.N * case.bias_step, generator=g) * case.K ** 0.5
        tensors.append(full.to(DTYPES[case.bias]).to(device)[::case.bias_step])
    return tuple(tensors)


def _call(tensors: Sequence[torch.Tensor], case: Case) -> dict[str, Any]:
    return dict(bias=tensors[4] if len(tensors) > 4 else None, out_dtype=DTYPES[case.out_dtype],
                use_fast_accum=case.fast_accum)


def cuda_rules(tensors: Sequence[torch.Tensor], case: Case) -> str | None:
    """Why `torch._scaled_mm` on a CUDA GPU refuses the call (None: it takes it), without a GPU: torch's checks
    on meta copies, then its CUDA kernel's rules (no two e5m2; bias: the output's dtype, no fp32; row-wise: bf16)."""
    meta = [t.to("meta") for t in tensors]
    try:
        torch._scaled_mm(*meta[:4], **_call(meta, case))
    except TORCH_REFUSALS as exc:
        return f"torch (meta): {(str(exc).splitlines() or [type(exc).__name__])[0]}"
    (a, b, scale_a, scale_b), out = tensors[:4], DTYPES[case.out_dtype]
    bias = tensors[4] if len(tensors) > 4 else None
    if a.dtype == b.dtype == E5M2:
        return "torch (CUDA): multiplication of two float8_e5m2 matrices is not supported"
    if bias is not None and (bias.numel() != b.shape[1] or out == F32 or bias.dtype != out):
        return f"torch (CUDA): a {bias.dtype} bias of {bias.numel()} elements with a {out} output"
    if (scale_a.numel() > 1 or scale_b.numel() > 1) and out != BF16:
        return f"torch (CUDA): row-wise scaling with a {out} output"
    return None


def pool(ki: Any, space: Sequence[dict[str, int]]) -> list[Any]:
    """The templates gemmtune tunes `ki` among, the Triton one's space `space` (on CPU it joins)."""
    from gemmtune.templates.registry import active_templates
    from gemmtune.templates.triton.scaled_mm import TritonScaledMMTemplate
    triton = TritonScaledMMTemplate(space=space)
    templates = [triton if t.uid == triton.uid else t for t in active_templates(ki, None)]
    if all(t.uid != triton.uid for t in templates) and triton.supports(ki):
        templates.append(triton)
    return templates


def run_case(case: Case, device: str, space: Sequence[dict[str, int]], tally: Tally) -> None:
    """One fp8 case: the verdicts, then (where gemmtune takes it) gemmtune's result, torch's and the pool."""
    import gemmtune
    from gemmtune.core.inputs import KernelInputs
    from gemmtune.measure.correctness import check, scaled_reference, tolerance
    tensors, note = operands(case, device), (case.index, case.describe())
    tally.counts["cases"] += 1
    refusal, theirs = cuda_rules(tensors, case) if device == "cpu" else None, None
    try:  # torch's verdict: on CPU, whose kernel takes calls a GPU refuses, `cuda_rules`
        theirs = torch._scaled_mm(*tensors[:4], **_call(tensors, case))
    except TORCH_REFUSALS as exc:
        refusal = refusal or f"torch: {(str(exc).splitlines() or [type(exc).__name__])[0]}"
    results: dict[str, torch.Tensor] = {}
    try:
        for what in ("gemmtune.scaled_mm", "gemmtune.scaled_mm warm"):  # the tuned call, then the dispatch
            results[what] = gemmtune.scaled_mm(*tensors[:4], **_call(tensors, case))
    except gemmtune.InputError as exc:
        if refusal is None:
            return tally.add(*note, "mismatch", "gemmtune refuses, torch runs it", str(exc))
        tally.counts["refused, as torch"] += 1
        tally.refusals[re.sub(r"\b\d+\b", "#", str(exc).split(";")[0])] += 1
        return None
    except Exception as exc:  # noqa: BLE001 - an untyped error is a finding
        return tally.add(*note, "error", "gemmtune.scaled_mm", f"{type(exc).__name__}: {exc}")
    if refusal is not None:
        return tally.add(*note, "mismatch", "torch refuses, gemmtune runs it", refusal)
    tally.counts["computed"] += 1
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=DTYPES[case.out_dtype], fast_accum=case.fast_accum)
    ref = scaled_reference(tensors)
    for what, out in {**results, **({"torch": theirs} if theirs is not None else {})}.items():
        if problem := check(ki, out, ref):  # torch's wrong results are counted apart
            tally.add(*note, "torch wrong" if what == "torch" else "wrong", what, problem)
    mine = results["gemmtune.scaled_mm"]
    if theirs is not None and theirs.numel():  # gemmtune's result against torch's
        rel = float(torch.linalg.vector_norm((mine.double() - theirs.double()).nan_to_num())) / (
            float(torch.linalg.vector_norm(theirs.double().nan_to_num())) or 1.0)
        if rel > tolerance(ki):
            tally.add(*note, "differs from torch", "gemmtune.scaled_mm", f"relative difference {rel:.2e}")
    if ki.M and ki.K:  # an empty problem has no pool: torch computes it
        templates = pool(ki, space)
        run_choices(ki, tensors, ref, templates, [c for t in templates for c in t.configs(ki)], note, tally)
    return None


def fuzz_space(device: str, size: str, configs: int, seed: int) -> list[dict[str, int]]:
    """The Triton configs every fp8 case runs: SMALL_SPACE on CPU, else a seeded sample of the space."""
    from gemmtune.templates.triton.scaled_mm import config_space
    space = [dict(c) for c in SMALL_SPACE] if device == "cpu" else config_space(size)
    return random.Random(seed).sample(space, configs) if device != "cpu" and 0 < configs < len(space) else space


def fuzz(cases: int, seed: int, max_dim: int, device: str, space: Sequence[dict[str, int]],
         progress: Callable[[Tally], None] | None = None) -> Tally:
    """`cases` seeded fp8 cases; their tally (handed to `progress` every 25 cases)."""
    rng, tally = random.Random(seed), Tally()
    for i in range(cases):
        run_case(draw(rng, i, max_dim, e4m3_nan=device != "cpu"), device, space, tally)
        if progress is not None and (i + 1) % 25 == 0:
            progress(tally)
    return tally


def table(tally: Tally, columns: Sequence[str] = COLUMNS) -> str:
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            "| " + " | ".join(str(tally.counts[c]) for c in columns) + " |"]
    rows += [f"  {uid}: {n} {status}" for (uid, status), n in sorted(tally.per_kernel.items())]
    rows += [f"  refused, as torch, {n}x: {rule}" for rule, n in tally.refusals.most_common()]
    rows += ["  case {case} ({problem}): {kind}: {what}: {detail}".format(**f) for f in tally.findings[:20]]
    return "\n".join(rows)


def write(path: str, tally: Tally, args: argparse.Namespace, space: Sequence[dict[str, int]]) -> None:
    data = {"kind": args.kind, "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
            "torch": torch.__version__, "counts": dict(tally.counts), "passed": tally.passed(),
            "seconds": round(time.perf_counter() - tally.started, 1), "space": list(space),
            "per_kernel": {f"{uid}:{status}": n for (uid, status), n in sorted(tally.per_kernel.items())},
            "refusals": dict(tally.refusals.most_common()), "findings": tally.findings, "command": " ".join(sys.argv)}
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1, default=str)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--kind", default="mm", choices=("mm", "fp8"), help="mm/addmm/bmm, or fp8 torch._scaled_mm")
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-dim", type=int, default=1024, help="largest M, K, N drawn (>= 16)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--configs", type=int, default=6, help="configs sampled once from each space (0: all)")
    p.add_argument("--configs-per-case", type=int, default=3, help="mm: configs per template per case")
    p.add_argument("--jobs", type=int, default=1, help="mm: processes, each with its own share of the cases")
    p.add_argument("--out", default="fuzz.json")
    args = p.parse_args(argv)
    if args.max_dim < 16 or args.cases < 1:
        p.error("--max-dim must be >= 16 and --cases >= 1")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("note: without TRITON_INTERPRET=1 the Triton templates do not run on CPU", file=sys.stderr)
    os.environ.setdefault("GEMMTUNE_STORE", "memory")  # every case tuned afresh, nothing kept
    os.environ.setdefault("GEMMTUNE_EFFORT", "quick")
    if args.kind == "mm":
        space, jobs = [], [(j, args.jobs, vars(args)) for j in range(args.jobs)]
        with multiprocessing.get_context("spawn").Pool(args.jobs) as workers:  # a process per share of the cases
            tally = functools.reduce(Tally.merge, workers.map(mm_shard, jobs), Tally())
    else:
        space = fuzz_space(args.device, "default", args.configs, args.seed)
        tally = fuzz(args.cases, args.seed, args.max_dim, args.device, space,
                     functools.partial(write, args.out, args=args, space=space))  # a run cut short keeps its counts
    write(args.out, tally, args, space)
    print(table(tally, MM_COLUMNS if args.kind == "mm" else COLUMNS))
    return 0 if tally.passed() else 1


if __name__ == "__main__":
    sys.exit(main())
