"""Render docs/RESULTS.md, and README.md's results table, from a small named set of result files.

The page is bench/results_page.md with its `{name}` fields filled by the tables below. Every number
comes from a file named here (in bench/results/); every row names its run's command, device and date,
from the file or, where the file lacks them, from RECORD. A missing file is an error.

    python bench/results.py              # print the page
    python bench/results.py --write      # write docs/RESULTS.md, and README.md between its results markers
    python bench/results.py --check      # exit 1 naming each page that differs from the render
    python bench/results.py --cited      # the cited result files, one a line
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS, PAGE, README = ROOT / "bench" / "results", ROOT / "docs" / "RESULTS.md", ROOT / "README.md"
TEMPLATE, BEGIN, END = ROOT / "bench" / "results_page.md", "<!-- results -->", "<!-- /results -->"
BF16, HARD = ("compare_default_full_runF_2026-11-30.json",), ("compare_hard_h100_2026-12-06.json",)
MISALIGNED = tuple(f"compare_misaligned{v}_h100_2026-12-{d}.json"
                   for v, d in (("", "06"), ("", "07"), ("_view", "07"), ("_weight", "07")))
STAGE0 = tuple(f"compare_hard_p1_stage0_{n}_h200_2026-12-06.json" for n in (14, 20))
FP8_18 = ("compare_fp8_18_run3_merged_h100_2026-12-05.json",)
FP8_64 = ("compare_fp8_h200_2026-12-02.json", "compare_fp8_library_h200_2026-12-02.json",
          "compare_fp8_rest_h200_2026-12-02.json")
MODELS = ("models_llama64_h200_2026-12-04.json", "models_stack512_h200_2026-12-04.json",
          "models_stack1_h200_2026-12-03.json", "models_stack1_store_run2_h200_2026-12-04.json")
EAGER = (tuple(f"steady_eager_release{s}_h100_2026-12-05.json" for s in ("", "_run2", "_run3", "_run4", "_run5")),
         ("steady_eager_512_h100_2026-12-05.json",))
CPU = ("cpu_suite_2core_2026-12-06.json", "cpu_busy_2core_2026-12-06.json")
REDIS = ("redis_store_cpu_2026-12-01.json",)
CHECKS = ("first_use_check_cpu_2026-12-06.json", "first_use_check_h100_2026-12-06.json")
SERVING = ("serving_h100_2026-12-06.json", "serving_steady_h100_2026-12-07.json", "serving_warmup_h100_2026-12-07.json",
           "serving_warmup_run2_h100_2026-12-07.json", "serving_warmup_shared_h100_2026-12-07.json",
           "serving_compile_shared_h100_2026-12-07.json")
WHOLE, STATIC = ("models_gpt2_h100_2026-12-07.json",), ("serving_static_h100_2026-12-07.json",)
# What a file does not say of its own run (or says only in parts).
RECORD: dict[str, dict[str, str]] = {
    BF16[0]: {"command": "python bench/compare.py --exhaustive square-2048,square-8192,llama3-8b-down-m16,"
                         "llama3-8b-gate_up-m128 (in halves: --part 1/2 and 2/2 on two GPUs, then --merge)"},
    FP8_18[0]: {"command": "python bench/compare.py --suite bench/shapes_fp8.json --only ‹18 shapes› --rounds 20 "
                           "(in halves of 9, then --merge)"},
    HARD[0]: {"command": "python bench/compare.py --suite bench/shapes_hard.json --rounds 20 (in halves: --part 1/2 "
                         "and 2/2, then --merge; the second half stopped at 21 of 28 shapes, out of device time)"},
    REDIS[0]: {"device": "the 2-core CPU machine"}, SERVING[0]: {"command": "python bench/serving.py (meta.calls)"},
    SERVING[2]: {"command": "python bench/serving.py --first eager_range,eager_range_store,eager_range_again "
                            "--steady ''"},
    SERVING[3]: {"command": "python bench/serving.py --first eager_range,eager_range_store --steady ''"},
    **{SERVING[i]: {"command": f"GEMMTUNE_SHARE_KERNELS=1 GEMMTUNE_STORE_KEY=$KEY python bench/serving.py --first {first} "
                               "--steady ''"} for i, first in ((4, "eager_range,eager_range_store"),
                                                               (5, "default,gemmtune,gemmtune_store"))},
    WHOLE[0]: {"command": "python bench/models.py --cases gpt2:8192 --first '' --steady eager,eager_warmup,"
                          "eager_warmup_padded,default,max_autotune --rounds 10"},
    STATIC[0]: {"command": "python bench/serving.py --first '' --steady '' --static 16,2048 --rounds 5"},
    CHECKS[0]: {"device": "the 2-core CPU machine",
                "command": "python bench/redis_store.py --first-use --device cpu --sizes 64,256,512,1024 --reps 7"},
    CHECKS[1]: {"command": "python bench/redis_store.py --first-use --device cuda --backends triton --sizes 256,1024,4096"}}
SRC, PLAIN = ["command", "device", "date", "file"], ("eager", "eager_copy", "eager_late")


def cited() -> list[str]:
    """Every result file the page cites, in page order."""
    return [*BF16, *HARD, *MISALIGNED, *STAGE0, *FP8_18, *FP8_64, *MODELS, *WHOLE, *EAGER[0], *EAGER[1], *SERVING,
            *STATIC, *CPU, *REDIS, *CHECKS]


def load(results: Path, name: str) -> Any:
    if not (results / name).is_file():
        raise SystemExit(f"bench/results.py: {results / name}: no such result file (docs/RESULTS.md cites it)")
    return json.loads((results / name).read_text())


def short(command: str) -> str:
    """The command as typed: no output paths, a `--only` list of more than 4 shapes counted."""
    command = " ".join(re.sub(r"(^| )--(out|root) \S+", "", command).split())
    command = re.sub(r"--only (\S+,\S+,\S+,\S+,\S+)", lambda m: f"--only ‹{m[1].count(',') + 1} shapes›", command)
    return re.sub(r"^((?:\w+=\S* )*)bench/", r"\1python bench/", command)


def source(results: Path, names: tuple[str, ...]) -> list[str]:
    """The command, device, date and file cells of a row read from `names`."""
    cells: list[list[str]] = [[], [], []]
    for name in names:
        meta = {**(data := load(results, name)).get("meta", data), **RECORD.get(name, {})}
        command = meta.get("command") or " ".join([meta.get("script", ""), *meta.get("argv", [])]).strip()
        for cell, what, value in zip(cells, ("command", "device", "date"),
                                     (command, meta.get("device") or meta.get("machine"), meta.get("date"))):
            if not value:
                raise SystemExit(f"bench/results.py: {name} has no {what}: give it one in RECORD")
            value = f"`{short(value)}`" if what == "command" else value.removeprefix("NVIDIA ")
            cell += [value] if value not in cell else []
    return ["; ".join(c) for c in cells] + [", ".join(f"`{n}`" for n in names)]


def md(head: list[str], rows: list[list[str]]) -> str:
    line = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "---|" * len(head), *map(line, rows)])


def num(value: float | None, fmt: str = ".3f", unit: str = "x") -> str:
    return "-" if value is None or math.isnan(value) else f"{value:{fmt}}{unit}"


def suite(results: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """A `bench/compare.py` suite's summary from its rows; Inductor's only where it timed every shape."""
    rows = [r for n in names for r in load(results, n)["rows"]]
    best = [r["gemmtune_ms"] / min(x for x in (r["cublas_ms"], r.get("inductor_ms"), r.get("exhaustive_ms")) if x)
            for r in rows]
    ind = all(r.get("inductor_tune_s") for r in rows)
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    return {"rows": rows, "n": len(rows), "slowest": min(r["speedup_vs_cublas"] for r in rows),
            "geo": math.exp(statistics.fmean(math.log(r["speedup_vs_cublas"]) for r in rows)),
            "ind": math.exp(statistics.fmean(math.log(r["inductor_speedup_vs_cublas"]) for r in rows)) if ind else None,
            "within": sum(b <= 1.01 for b in best), "cold": med("gemmtune_cold_s"), "warm": med("gemmtune_warm_s"),
            "ind_s": med("inductor_tune_s") if ind else None}


def suites(results: Path, which: tuple[tuple[str, tuple[str, ...]], ...], lib: str) -> str:
    rows = [[label, f"**{num(s['geo'])}** ({num(s['slowest'])})", num(s["ind"]), f"{s['within']} / {s['n']}",
             f"**{num(s['cold'], '.2f', ' s')}** / {num(s['warm'], '.2f', ' s')}", num(s["ind_s"], ".1f", " s"),
             *source(results, names)] for label, names in which for s in [suite(results, names)]]
    return md(["suite", f"pick x {lib}, geomean (slowest)", f"Inductor x {lib}", "within 1 % of the best",
               "tuning per shape: cold / cached", "Inductor's tuning", *SRC], rows)


def gpu_tables(results: Path) -> dict[str, str]:
    shapes = [[r["name"], f"{r['M']}x{r['K']}x{r['N']} B={r['b_layout']}", f"`{r['winner_template']}`",
               num(r["speedup_vs_cublas"]), num(r.get("inductor_speedup_vs_cublas")),
               num(r["gemmtune_cold_s"], ".2f", " s")] for r in suite(results, BF16)["rows"]]
    return {"bf16": suites(results, (("24 shapes of `bench/shapes.json`", BF16),
                                     ("50 of the 57 shapes of `bench/shapes_hard.json`", HARD),
                                     ("4 of its misaligned shapes, again", MISALIGNED[:1]),
                                     ("the same 4, padded operands copied into kept storage", MISALIGNED[1:2]),
                                     ("the same 4 again, the padded output layout timed beside", MISALIGNED[2:3]),
                                     ("the same 4, the padded layout's B a frozen weight", MISALIGNED[3:]),
                                     ("its first 29 shapes, 14 binaries kept to compile (the default)", STAGE0[:1]),
                                     ("the same 29, 20 kept (the default before)", STAGE0[1:])), "cuBLAS"),
            "bf16_shapes": md(["shape", "MxKxN", "pick's kernel", "x cuBLAS", "Inductor x cuBLAS", "tuning, cold"],
                              shapes),
            "fp8": suites(results, (("18 shapes, with Inductor", FP8_18), ("all 64 shapes", FP8_64)), "cuBLASLt")}


def model_tables(results: Path) -> dict[str, str]:
    first, steady = [], []
    for name in MODELS:
        for case in load(results, name)["cases"]:
            f = {r["variant"]: r.get("first_s") for r in case.get("first", [])}
            s = {r["variant"]: r.get("ratio_vs_max_autotune") for r in case.get("steady", [])}
            sec = lambda *vs: " / ".join(num(f.get(v), ".1f", " s") for v in vs)  # noqa: E731
            if f:
                first.append([f"`{case['case']}`", *map(sec, ("default", "max_autotune", "gemmtune", "gemmtune_store")),
                              sec("gemmtune_again", "max_autotune_again"),
                              sec("eager_warmup", "eager_warmup_store", "eager_warmup_shared_store"),
                              *source(results, (name,))])
            if s.get("gemmtune"):
                speed = [num(1 / s[v]) if s.get(v) else "-" for v in ("default", "gemmtune", "gemmtune+train")]
                steady.append([f"`{case['case']}`", *speed, *source(results, (name,))])
    return {"first_calls": md(["case", "default compile", "max-autotune", "gemmtune", "gemmtune, warm store",
                               "second start: gemmtune / max-autotune",
                               "eager warm-up: cold / warm store / with kernels", *SRC], first),
            "steady": md(["case", "default compile x max-autotune", "gemmtune x max-autotune",
                          "training step, gemmtune", *SRC], steady)}


def variant_tables(results: Path) -> dict[str, str]:
    """A whole model's steady variants beside eager and max-autotune; per M, the GEMMs' GPU time of gemmtune's
    dynamic compile against a static max-autotune compile for that M."""
    rows = [[f"`{c['case']}`", f"`{r['variant']}`", num(r["ms"], ".2f", " ms"), num(r["ratio_vs_max_autotune"]),
             num(r.get("ratio_vs_eager")), *source(results, WHOLE)] for c in load(results, WHOLE[0])["cases"]
            for r in c["steady"]]
    by = {(r["M"], r["variant"]): r for r in load(results, STATIC[0])["steady"]}
    g, st = (lambda m, v=v: by[m, v] for v in ("gemmtune", "static"))
    static = [[str(m), f'{g(m)["ms"]:.3f} / {st(m)["ms"]:.3f}', f'{g(m)["gemm_ms"]:.3f} / {st(m)["gemm_ms"]:.3f}',
               num(g(m)["gemm_ms"] / st(m)["gemm_ms"]), *source(results, STATIC)] for m in sorted({m for m, _ in by})]
    return {"whole_model": md(["case", "variant", "per forward", "x max-autotune's time", "x eager's", *SRC], rows),
            "static": md(["M", "ms per forward: gemmtune / static", "GEMM GPU ms: gemmtune / static",
                          "GEMM time, gemmtune / static", *SRC], static)}


def pooled(runs: list[Any], case: str, variant: str) -> tuple[float, float, float, int] | None:
    """Speed vs plain eager over `runs`' rounds: median per-round ratio, its bootstrap 95 % interval, rounds."""
    ratios: list[float] = []
    for run in runs:
        ms = {s["variant"]: s["round_ms"] for c in run["cases"] if c["case"] == case for s in c["steady"]}
        if variant in ms and all(p in ms for p in PLAIN):
            ratios += [sum(r) / len(PLAIN) / v for v, *r in zip(ms[variant], *(ms[p] for p in PLAIN))]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(400 if ratios else 0))
    return (statistics.median(ratios), boot[10], boot[389], len(ratios)) if ratios else None


def eager_table(results: Path) -> dict[str, str]:
    rows = []
    for names in EAGER:
        runs = [load(results, n) for n in names]
        for case in dict.fromkeys(c["case"] for run in runs for c in run["cases"]):
            got = [pooled(runs, case, v) for v in ("eager_warmup", "eager_copy", "eager_warmup_patched")]
            text = ["-" if g is None else f"{g[0]:.4f}x ({g[1]:.4f}-{g[2]:.4f})" for g in got]
            rounds = f"{got[0][3] if got[0] else 0} ({len(runs)} run{'s' * (len(runs) > 1)})"
            rows.append([f"`{case}`", f"**{text[0]}**", *text[1:], rounds, *source(results, names)])
    return {"eager": md(["case", "warm-up, then eager", "A/A: plain eager", "kept patched", "rounds", *SRC], rows)}


def serving_tables(results: Path) -> dict[str, str]:
    """Every batch size: each first-call process, and per M the speeds of one steady-state run's variants."""
    d, src = load(results, SERVING[0]), source(results, SERVING[:1])
    runs = ((d, src), *((load(results, n), source(results, (n,))) for n in SERVING[2:]))  # then the warm-up runs
    first = [[f"`{r['variant']}`", num(r["setup_s"], ".1f", " s"), num(r["total_s"], ".1f", " s"),
              str(r["benchmarked"]), str(r["tunes_after_setup"]), *s] for f, s in runs for r in f["first"]]
    ms = {(r["M"], r["variant"], k): r for k in ("steady", "steady_a", "steady_c") for r in d[k]}
    speed = lambda m, k, a, b: num(ms[m, b, k]["ms"] / ms[m, a, k]["ms"])  # noqa: E731
    rows = [[str(m), speed(m, "steady", "gemmtune", "default"), speed(m, "steady_a", "max_autotune", "default"),
             f'{speed(m, "steady_a", "eager_range", "eager")} / {speed(m, "steady_c", "eager_range", "eager")}',
             speed(m, "steady", "default", "eager"), f"{ms[m, 'default', 'steady']['gemm_ms']:.3f} / "
             f"{ms[m, 'gemmtune', 'steady']['gemm_ms']:.3f}"] for m in d["meta"]["M"]]
    run_d, src_d = load(results, SERVING[1]), source(results, SERVING[1:2])
    by = {(r["M"], r["variant"]): r for r in run_d["steady"]}
    vs = lambda r: f"{r['ratio_vs_max_autotune']:.3f} ({r['ratio_q1_q3'][0]:.3f}-{r['ratio_q1_q3'][1]:.3f})"  # noqa: E731
    vs_ma = [[str(m), vs(by[m, "gemmtune"]), vs(by[m, "default"]), *src_d] for m in run_d["meta"]["M"]]
    return {"serving_first": md(["variant", "set-up", "to the end of every M's first call", "Inductor benchmarks",
                                 "eager dispatch tunes after the set-up", *SRC], first),
            "serving": md(["M", "gemmtune compile x default compile", "max-autotune x default (run A)",
                           "eager after range warm-up x eager: run A / run C", "default compile x eager",
                           "GEMM GPU ms per forward: default / gemmtune"], rows),
            "serving_vs_max_autotune": md(["M", "gemmtune time x max-autotune's (q1-q3)", "default x max-autotune",
                                           *SRC], vs_ma)}


def cpu_tables(results: Path) -> dict[str, str]:
    shapes = [[r["name"], f"{r['op']} {r['M']}x{r['K']}x{r['N']}", f"`{r['pick']}`", num(r["pick_ms"], ".4f", " ms"),
               num(r["torch_ms"], ".4f", " ms"), num(r["ratio_vs_torch"]), num(r["tune_s"], ".2f", " s")]
              for r in load(results, CPU[0])["shapes"]]
    rows = []
    for name in CPU:
        d = load(results, name)
        s, busy = d["summary"], f", tuned beside {d['busy']} busy processes" if d.get("busy") else ""
        rows.append([f"{s['n']} shapes{busy}", f"**{num(s['geomean_vs_torch'])}** ({num(s['worst_vs_torch'])})",
                     f"{s['library_picks']} / {s['n']}", num(s["median_tune_s"], ".2f", " s"),
                     *source(results, (name,))])
    return {"cpu": md(["suite", "pick x torch, geomean (slowest)", "library picks", "tuning per shape, median", *SRC],
                      rows),
            "cpu_shapes": md(["shape", "problem", "pick", "pick's time", "torch's time", "x torch", "tuning"], shapes)}


def store_table(results: Path) -> dict[str, str]:
    r, src = load(results, REDIS[0]), source(results, REDIS)
    look, call = r["lookups"], r["warm_call_us"]
    runs = "; ".join(f"{f['procs']} processes{how}: {f['finished']} finished, {'all' if f['correct'] else 'NOT all'} "
                     f"correct, {'the same' if f['agree'] else 'differing'} picks, {r['picks_stored'][k]} stored"
                     for k, f, how in (("fleet", r["fleet"], " at once"),
                                       ("killed", r["fleet_killed"], ", the server killed and restarted")))
    rows = [["a lookup: cold (median / p99); warm",
             f"{look['cold_us']:.0f} / {look['cold_p99_us']:.0f} µs; {look['warm_us']:.1f} µs", *src],
            ["a warm `gemmtune.mm` call: SQLite store / Redis store",
             f"{call['sqlite']:.2f} / {call['redis']:.2f} µs", *src],
            ["processes tuning the same shapes on one Redis store", runs, *src]]
    for name in CHECKS:
        c = load(results, name)
        rows.append([f"the first-use check, per pick ({c['rows'][0]['dtype']}, {c['backends'][0]} picks)",
                     ", ".join(f"{x['check_per_pick_ms']:.2f} ms at {x['size']}³" for x in c["rows"]),
                     *source(results, (name,))])
    return {"store": md(["what", "reading", *SRC], rows)}


def summary(results: Path) -> str:
    """README.md's table: a line per section, with its device and date."""
    b, f, cpu = suite(results, BF16), suite(results, FP8_18), load(results, CPU[0])["summary"]
    case = load(results, MODELS[0])["cases"][0]
    first, steady = ({r["variant"]: r for r in case[k]} for k in ("first", "steady"))
    eager = pooled([load(results, n) for n in EAGER[0]], "llama:64", "eager_warmup") or (math.nan,) * 3
    at = lambda names: ", ".join(source(results, names)[1:3])  # noqa: E731
    return md(["what", "reading (above 1: faster)", "device, date"], [
        ["GPU, 24 bf16 GEMMs: speed vs cuBLAS", f"**{num(b['geo'])}** geomean (Inductor max-autotune {num(b['ind'])}); "
         f"{b['within']}/{b['n']} within 1 % of the fastest kernel found", at(BF16)],
        ["GPU, tuning a new shape (median)", f"**{num(b['cold'], '.2f', ' s')}** cold, {num(b['warm'], '.2f', ' s')} "
         f"with its binaries cached (Inductor {num(b['ind_s'], '.2f', ' s')})", at(BF16)],
        ["GPU, 18 fp8 GEMMs: speed vs `torch._scaled_mm`", f"**{num(f['geo'])}** geomean (Inductor {num(f['ind'])}); "
         f"tuning {num(f['cold'], '.2f', ' s')} (Inductor {num(f['ind_s'], '.1f', ' s')})", at(FP8_18)],
        ["a transformers Llama, 64 tokens: `torch.compile` with `install()`",
         f"**{num(1 / steady['gemmtune']['ratio_vs_max_autotune'])}** max-autotune's speed; first call "
         f"{first['gemmtune']['first_s']:.1f} s (max-autotune {first['max_autotune']['first_s']:.1f} s)", at(MODELS[:1])],
        ["the same Llama in eager after `gemmtune.warmup`", f"{num(eager[0], '.4f')} plain eager's speed "
         f"(95 % interval {eager[1]:.4f}-{eager[2]:.4f})", at(EAGER[0])],
        [f"CPU, {cpu['n']} float32 GEMMs: speed vs torch", f"**{num(cpu['geomean_vs_torch'])}** geomean; "
         f"torch's own op kept on {cpu['library_picks']}/{cpu['n']}", at(CPU)]])


def page(results: Path = RESULTS, template: Path = TEMPLATE) -> str:
    """docs/RESULTS.md: the template with its fields filled from the cited files."""
    tables = {"summary": summary(results), **gpu_tables(results), **model_tables(results), **eager_table(results),
              **serving_tables(results), **variant_tables(results), **cpu_tables(results), **store_table(results)}
    return re.sub(r"\{(\w+)\}", lambda m: tables[m[1]], template.read_text())


def readme_with(block: str, readme: str) -> str:
    """`readme` with `block` between its results markers."""
    if BEGIN not in readme or END not in readme or readme.index(BEGIN) > readme.index(END):
        raise SystemExit(f"bench/results.py: README.md has no {BEGIN} ... {END} markers to write between")
    return readme[:readme.index(BEGIN) + len(BEGIN)] + "\n" + block + "\n" + readme[readme.index(END):]


def pages(results: Path, page_path: Path = PAGE, readme_path: Path = README) -> dict[Path, str]:
    """What docs/RESULTS.md and README.md should hold (README.md changes only between its markers)."""
    return {page_path: page(results), readme_path: readme_with(summary(results), readme_path.read_text())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    act = p.add_mutually_exclusive_group()
    act.add_argument("--write", action="store_true", help="write docs/RESULTS.md and README.md's results block")
    act.add_argument("--check", action="store_true", help="exit 1 naming each page that differs from the render")
    act.add_argument("--cited", action="store_true", help="print the cited result files, one a line")
    p.add_argument("--results", type=Path, default=RESULTS, help="the result files' folder (default bench/results)")
    args = p.parse_args(argv)
    if args.cited:
        print("\n".join(cited()))
    elif args.check or args.write:
        want = pages(args.results)  # all rendered before anything is written
        stale = [path for path, text in want.items() if path.read_text() != text]
        for path in stale:
            if args.write:
                path.write_text(want[path])
            else:
                print(f"{path.relative_to(ROOT)} is stale: run python bench/results.py --write", file=sys.stderr)
        return int(args.check and bool(stale))
    else:
        print(page(args.results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
