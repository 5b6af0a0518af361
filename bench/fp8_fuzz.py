"""fp8 fuzzing: random `torch._scaled_mm` problems through every candidate kernel, `gemmtune.scaled_mm` and torch.

Each case draws M, K and N (odd sizes included: any M, and now and then a K or N that is not a
multiple of 16, which torch refuses), tensor-wise or row-wise scales (now and then one of each,
refused), an e4m3 or e5m2 A and B (two e5m2 refused), the output dtype, a bias (none, the output's
dtype, now and then another dtype or a strided view) and `use_fast_accum`; the data are random
normal rows of spread magnitudes, quantised as torchao does (`gemmtune.offline.fp8_spec.quantise`),
now and then with a NaN (or, in an e5m2 A, an infinity) in A.

Then, on the device given:
- torch's verdict: on CUDA, `torch._scaled_mm` itself; on CPU, whose kernel takes calls the GPU
  refuses, torch's own checks on meta copies of the operands (its meta kernel: sizes, layouts,
  scales) and the dtype rules its CUDA kernel adds (docs/FP8.md): that is `cuda_rules`;
- gemmtune's: `gemmtune.scaled_mm` computes the case or raises `gemmtune.InputError`.  A case both
  refuse is "refused, as torch"; one refused by one side only is a mismatch;
- for a case gemmtune takes, every choice of the pool gemmtune tunes it among (`active_templates`,
  plus the Triton template on CPU under TRITON_INTERPRET=1) runs on a NaN-poisoned output: every config
  of the fuzz space x every swizzle, and the library kernel.  Each output, gemmtune.scaled_mm's (its
  tuned call and its warm dispatch) and torch's are checked against the float64 product of the
  dequantised inputs with the gate's own check and tolerance (`gemmtune.measure.correctness`), and
  gemmtune's result against torch's.

The pass condition: 0 wrong results, 0 mismatches, 0 errors (exit status 1 otherwise).

    python bench/fp8_fuzz.py --device cuda --cases 200 --out fp8_fuzz.json               # a GPU, cc >= 8.9
    TRITON_INTERPRET=1 python bench/fp8_fuzz.py --device cpu --cases 20 --max-dim 48 --out fp8_fuzz.json

Prints a table and writes JSON (also every 25 cases, so a run cut short leaves its counts).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

E4M3, E5M2, BF16, F16, F32 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16, torch.float32
DTYPES = {"e4m3": E4M3, "e5m2": E5M2, "bf16": BF16, "fp16": F16, "fp32": F32}
EDGES = (1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 511, 512, 1000, 1024)
SMALL_SPACE = (dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_stages=2, num_warps=4),
               dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, num_stages=2, num_warps=4))
"""The fuzz space under Triton's interpreter (every config of the real spaces is too slow there)."""
TORCH_REFUSALS = (RuntimeError, ValueError, TypeError, NotImplementedError)


@dataclass(frozen=True)
class Case:
    """One drawn problem: sizes, scale kind ("mixed": scale_a tensor-wise, scale_b row-wise), the fp8
    dtypes, the output dtype, the bias ("" none, else its dtype; `bias_step` 2: every other element of
    a longer tensor), fast accumulation, B's layout ("row" is refused), the seed of its data and the
    refusal it probes ("": none, `PROBES`)."""

    index: int
    M: int
    K: int
    N: int
    scales: str
    a_dtype: str
    b_dtype: str
    out_dtype: str
    bias: str
    bias_step: int
    fast_accum: bool
    b_layout: str
    seed: int
    probe: str = ""
    special: str = ""  # "nan" or "inf" (e5m2 A only: e4m3fn has no infinity): one such element of A

    def describe(self) -> str:
        bias = f" bias {self.bias}" + ("/step 2" if self.bias_step > 1 else "") if self.bias else ""
        return (f"{self.M}x{self.K}x{self.N} {self.scales} {self.a_dtype}x{self.b_dtype}->{self.out_dtype}{bias}"
                f"{' fast' if self.fast_accum else ''}{' b row-major' if self.b_layout == 'row' else ''}"
                f"{' ' + self.special + ' in a' if self.special else ''}")


PROBES = ("odd K", "odd N", "mixed scales", "two e5m2", "row-major b", "bias of another dtype",
          "bias with float32 out", "row-wise without bf16 out")
"""The calls torch refuses (row-wise scales without a bf16 output: on some GPUs), one per probe case."""


def _dim(rng: random.Random, max_dim: int, multiple_of_16: bool | None) -> int:
    """A size up to `max_dim`, half the time an edge of `EDGES`: any (None), a multiple of 16 or not one."""
    d = rng.choice([e for e in EDGES if e <= max_dim]) if rng.random() < 0.5 else rng.randint(1, max_dim)
    if multiple_of_16 is None:
        return d
    if multiple_of_16:
        return max(16, d // 16 * 16)
    return d if d % 16 else d + rng.choice((-1, 1))


def draw(rng: random.Random, index: int, max_dim: int, probes: float = 0.3, e4m3_nan: bool = True) -> Case:
    """One case: with probability `probes` a call torch refuses for one reason (`PROBES`), else one
    every GPU takes: M any size (now and then empty, often 1 to 4 rows), K and N multiples of 16.
    `e4m3_nan` False: no NaN in an e4m3 A (Triton's interpreter reads e4m3fn's NaN as 480); the
    draws are the same either way, that case only loses its NaN."""
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
    """(a, b, scale_a, scale_b[, bias]) of `case` on `device`: rows of random normal data scaled by
    2**U(-3, 3) each (so row-wise scales differ), quantised (then `special` in one element of a); b a
    [N, K] weight transposed."""
    g = torch.Generator().manual_seed(case.seed)

    def rows(r: int) -> torch.Tensor:
        return torch.randn(r, case.K, generator=g) * 2.0 ** (torch.rand(r, 1, generator=g) * 6 - 3)

    a, sa = _quantise(rows(case.M), DTYPES[case.a_dtype], case.scales == "rowwise")
    if case.special:  # NaN and Inf are data: they reach the output where the reference has them
        a[int(torch.randint(case.M, (), generator=g)), int(torch.randint(case.K, (), generator=g))] = float(case.special)
    w, sw = _quantise(rows(case.N), DTYPES[case.b_dtype], case.scales != "tensorwise")
    b = w.to(device).t() if case.b_layout == "col" else w.t().contiguous().to(device)
    sb = sw.t().contiguous() if case.scales != "tensorwise" else sw
    tensors = [a.to(device), b, sa.to(device), sb.to(device)]
    if case.bias:
        full = torch.randn(case.N * case.bias_step, generator=g) * case.K ** 0.5
        tensors.append(full.to(DTYPES[case.bias]).to(device)[::case.bias_step])
    return tuple(tensors)


def _first_line(exc: BaseException) -> str:
    return next(iter(str(exc).splitlines()), type(exc).__name__)


def _call(tensors: Sequence[torch.Tensor], case: Case) -> dict[str, Any]:
    return dict(bias=tensors[4] if len(tensors) > 4 else None, out_dtype=DTYPES[case.out_dtype],
                use_fast_accum=case.fast_accum)


def cuda_rules(tensors: Sequence[torch.Tensor], case: Case) -> str | None:
    """Why `torch._scaled_mm` on a CUDA GPU refuses the call (None: it takes it), judged without one:
    torch's own checks on meta copies (its meta kernel checks for CUDA: sizes, layouts, scales), then
    the dtype rules its CUDA kernel adds (docs/FP8.md): not two e5m2 matrices; a bias of the output's
    dtype, bf16 or fp16, none with a float32 output; row-wise scales with a bf16 output (the rule of
    the GPUs where torch runs row-wise scaling with its CUTLASS kernel: the rule every GPU keeps)."""
    meta = [t.to("meta") for t in tensors]
    try:
        torch._scaled_mm(*meta[:4], **_call(meta, case))
    except TORCH_REFUSALS as exc:
        return f"torch (meta): {_first_line(exc)}"
    a, b, scale_a, scale_b = tensors[:4]
    out = DTYPES[case.out_dtype]
    if a.dtype == b.dtype == E5M2:
        return "torch (CUDA): multiplication of two float8_e5m2 matrices is not supported"
    if len(tensors) > 4:
        bias = tensors[4]
        if bias.numel() != b.shape[1] or out == F32 or bias.dtype != out:
            return f"torch (CUDA): a {bias.dtype} bias of {bias.numel()} elements with a {out} output"
    if (scale_a.numel() > 1 or scale_b.numel() > 1) and out != BF16:
        return f"torch (CUDA): row-wise scaling with a {out} output"
    return None


def torch_verdict(tensors: Sequence[torch.Tensor], case: Case) -> tuple[str | None, torch.Tensor | None]:
    """(why torch refuses the call or None, torch's output where it ran)."""
    cpu = tensors[0].device.type == "cpu"
    refusal = cuda_rules(tensors, case) if cpu else None
    try:
        out = torch._scaled_mm(*tensors[:4], **_call(tensors, case))
    except TORCH_REFUSALS as exc:
        return refusal or f"torch: {_first_line(exc)}", None
    if not cpu:
        torch.cuda.synchronize()
    return refusal, out


@dataclass
class Tally:
    """Counts and findings (each a dict naming the case, what ran and what went wrong)."""

    counts: Counter = field(default_factory=Counter)
    per_kernel: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)  # gemmtune's refusals agreeing with torch, by rule
    started: float = field(default_factory=time.perf_counter)
    findings: list[dict[str, Any]] = field(default_factory=list)

    def add(self, case: Case, kind: str, what: str, detail: str) -> None:
        self.counts[kind] += 1
        self.findings.append({"case": case.index, "problem": case.describe(), "kind": kind, "what": what,
                              "detail": detail[:300]})

    def passed(self) -> bool:
        return not (self.counts["wrong"] or self.counts["mismatch"] or self.counts["error"])


def pool(ki: Any, space: Sequence[dict[str, int]]) -> list[Any]:
    """The templates gemmtune tunes `ki` among (`active_templates`), the Triton template's space
    replaced by `space`; on CPU under the interpreter the Triton template joins (it is not pooled there)."""
    from gemmtune.templates.registry import active_templates
    from gemmtune.templates.triton.scaled_mm import TritonScaledMMTemplate

    triton = TritonScaledMMTemplate(space=space)
    templates = [triton if t.uid == triton.uid else t for t in active_templates(ki, None)]
    if all(t.uid != triton.uid for t in templates) and triton.supports(ki):
        templates.append(triton)
    return templates


def run_pool(ki: Any, tensors: Sequence[torch.Tensor], ref: torch.Tensor, space: Sequence[dict[str, int]],
             case: Case, tally: Tally) -> None:
    """Every choice of the pool on a NaN-poisoned output, checked against `ref`."""
    from gemmtune.measure.compile import precompile
    from gemmtune.measure.correctness import check

    templates = {t.uid: t for t in pool(ki, space)}
    choices = [c for t in templates.values() for c in t.configs(ki)]
    built = precompile(choices, templates, ki, tensors, timeout_s=300)
    for c in choices:
        launch = built.launcher(c)
        tally.counts["kernels run"] += 1
        if launch is None:
            tally.add(case, "error", c.name, f"compile: {built.failures.get(c.binary_key)}")
            continue
        try:
            out = torch.full(ki.out_size, float("nan"), dtype=ki.result_dtype, device=tensors[0].device)
            launch(tensors, out, **c.runtime_dict)
            problem = check(ki, out, ref)
        except Exception as exc:  # noqa: BLE001 - a failing kernel is a finding; the fuzz goes on
            problem = None
            tally.add(case, "error", c.name, f"{type(exc).__name__}: {exc}")
        if problem:
            tally.add(case, "wrong", c.name, problem)
        tally.per_kernel[c.template_uid, "wrong" if problem else "ok"] += 1


def check_results(ki: Any, tensors: Sequence[torch.Tensor], ref: torch.Tensor, results: dict[str, torch.Tensor],
                  case: Case, tally: Tally) -> None:
    """gemmtune's and torch's outputs against `ref` (torch's wrong ones counted apart: not gemmtune's
    results), and gemmtune's against torch's within the gate's tolerance."""
    from gemmtune.measure.correctness import check, tolerance

    for what, out in results.items():
        problem = check(ki, out, ref)
        if problem:
            tally.add(case, "torch wrong" if what == "torch" else "wrong", what, problem)
    mine, theirs = results.get("gemmtune.scaled_mm"), results.get("torch")
    if mine is not None and theirs is not None and theirs.numel():
        diff = float(torch.linalg.vector_norm((mine.double() - theirs.double()).nan_to_num()))
        rel = diff / (float(torch.linalg.vector_norm(theirs.double().nan_to_num())) or 1.0)
        if rel > tolerance(ki):
            tally.add(case, "differs from torch", "gemmtune.scaled_mm", f"relative difference {rel:.2e}")


def run_case(case: Case, device: str, space: Sequence[dict[str, int]], tally: Tally) -> None:
    """One case: verdicts, then (where gemmtune takes it) the pool, gemmtune's result and torch's."""
    import gemmtune
    from gemmtune.core.inputs import KernelInputs
    from gemmtune.measure.correctness import scaled_reference

    tensors = operands(case, device)
    tally.counts["cases"] += 1
    refusal, theirs = torch_verdict(tensors, case)
    results: dict[str, torch.Tensor] = {}
    try:
        for what in ("gemmtune.scaled_mm", "gemmtune.scaled_mm warm"):  # the tuned call, then the dispatch
            results[what] = gemmtune.scaled_mm(*tensors[:4], **_call(tensors, case))
    except gemmtune.InputError as exc:
        if refusal is None:
            return tally.add(case, "mismatch", "gemmtune refuses, torch runs it", str(exc))
        tally.counts["refused, as torch"] += 1
        tally.refusals[re.sub(r"\b\d+\b", "#", str(exc).split(";")[0])] += 1
        return None
    except Exception as exc:  # noqa: BLE001 - an untyped error is a finding
        return tally.add(case, "error", "gemmtune.scaled_mm", f"{type(exc).__name__}: {exc}")
    if refusal is not None:
        return tally.add(case, "mismatch", "torch refuses, gemmtune runs it", refusal)
    tally.counts["computed"] += 1
    ki = KernelInputs.from_tensors("scaled_mm", *tensors, out_dtype=DTYPES[case.out_dtype], fast_accum=case.fast_accum)
    ref = scaled_reference(tensors)
    if theirs is not None:
        results["torch"] = theirs
    check_results(ki, tensors, ref, results, case, tally)
    if ki.M and ki.K:  # an empty problem has no pool: torch computes it
        run_pool(ki, tensors, ref, space, case, tally)
    return None


def fuzz_space(device: str, size: str, configs: int, seed: int) -> list[dict[str, int]]:
    """The Triton configs every case runs: the interpreter's small space on CPU, else the template's
    `size` space, or a fixed seeded sample of `configs` of it (0: all), the same for every case, so
    binaries compiled for one case serve the next."""
    from gemmtune.templates.triton.scaled_mm import config_space

    if device == "cpu":
        return [dict(c) for c in SMALL_SPACE]
    space = config_space(size)
    return random.Random(seed).sample(space, configs) if 0 < configs < len(space) else space


def fuzz(cases: int, seed: int, max_dim: int, device: str, space: Sequence[dict[str, int]],
         out: str | None = None, every: int = 25) -> Tally:
    """Run `cases` seeded cases; the tally (written to `out` every `every` cases and at the end)."""
    rng, tally = random.Random(seed), Tally()
    for i in range(cases):
        case = draw(rng, i, max_dim, e4m3_nan=device != "cpu")
        run_case(case, device, space, tally)
        if out and ((i + 1) % every == 0 or i + 1 == cases):
            write(out, tally, device, space)
            print(f"{i + 1} cases: {dict(tally.counts)}", flush=True)
    return tally


def write(path: str, tally: Tally, device: str, space: Sequence[dict[str, int]]) -> None:
    data = {"device": device if device == "cpu" else torch.cuda.get_device_name(), "torch": torch.__version__,
            "counts": dict(tally.counts), "passed": tally.passed(),
            "seconds": round(time.perf_counter() - tally.started, 1), "space": list(space),
            "per_kernel": {f"{uid}:{status}": n for (uid, status), n in sorted(tally.per_kernel.items())},
            "refusals": dict(tally.refusals.most_common()), "findings": tally.findings, "command": " ".join(sys.argv)}
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1, default=str)


COLUMNS = ("cases", "refused, as torch", "computed", "kernels run", "wrong", "mismatch", "error", "torch wrong",
           "differs from torch")


def table(tally: Tally) -> str:
    """The counts as a Markdown table, then each template's results and the first 20 findings."""
    rows = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
            "| " + " | ".join(str(tally.counts[c]) for c in COLUMNS) + " |"]
    rows += [f"  {uid}: {n} {status}" for (uid, status), n in sorted(tally.per_kernel.items())]
    rows += [f"  refused, as torch, {n}x: {rule}" for rule, n in tally.refusals.most_common()]
    rows += [f"  case {f['case']} ({f['problem']}): {f['kind']}: {f['what']}: {f['detail']}" for f in tally.findings[:20]]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-dim", type=int, default=1024, help="largest M, K, N drawn (>= 16)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--space", default="default", choices=("default", "max"), help="the Triton space (CUDA)")
    p.add_argument("--configs", type=int, default=6, help="CUDA: configs sampled once from the space (0: all)")
    p.add_argument("--out", default="fp8_fuzz.json")
    args = p.parse_args(argv)
    if args.max_dim < 16 or args.cases < 1:
        p.error("--max-dim must be >= 16 and --cases >= 1")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("note: without TRITON_INTERPRET=1 the Triton template does not run on CPU", file=sys.stderr)
    os.environ.setdefault("GEMMTUNE_STORE", "memory")  # every case tuned afresh, nothing kept
    os.environ.setdefault("GEMMTUNE_EFFORT", "quick")
    space = fuzz_space(args.device, args.space, args.configs, args.seed)
    tally = fuzz(args.cases, args.seed, args.max_dim, args.device, space, args.out)
    print(table(tally))
    return 0 if tally.passed() else 1


if __name__ == "__main__":
    sys.exit(main())
