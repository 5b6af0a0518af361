"""The whole-model table of docs/MODELS.md and README.md, rendered from the protocol runs' JSON
(`bench/models.py` output in bench/results/): one row per run and case, so every ratio in a row comes
from one protocol run (first calls in fresh processes with empty caches; steady state interleaved in
one process, as ratios to max-autotune-no-cudagraphs in the same rounds).

    python bench/models_table.py                 # print the table
    python bench/models_table.py --write         # put it between the markers of docs/MODELS.md and README.md

tests/test_models_table.py checks that both files hold the table these files give.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# The protocol runs, each case's runs oldest first: on the H200 (2026-12-01 to 2026-12-05), and the
# steady-eager runs of 2026-12-05 on an H100 (the file name says which card).  From the `*_release_*`
# runs on, `eager_warmup` is the warm-up's default, which releases the layers torch's op won;
# before, it kept every layer patched (what `eager_warmup_patched` measures since).
RUNS = ("models_stack1_h200_2026-12-01.json", "models_stack1_gemv_autotune_h200_2026-12-01.json",
        "models_stack1_h200_2026-12-03.json", "models_stack1_store_h200_2026-12-04.json",
        "models_stack1_store_run2_h200_2026-12-04.json",
        "models_stack64_timed_h200_2026-12-01.json",
        "models_stack512_h200_2026-12-01.json", "models_shortlist_h200_2026-12-01.json",
        "models_stack512_h200_2026-12-04.json",
        "models_stack512_kernel_split_h200_2026-12-01.json", "models_prologue_h200_2026-12-01.json",
        "models_llama64_h200_2026-12-01.json", "models_llama64_first_calls_h200_2026-12-01_s5.json",
        "models_llama64_first_calls_h200_2026-12-04.json", "models_llama64_h200_2026-12-04.json",
        "steady_stack512_h200_2026-12-04.json", "steady_eager_h200_2026-12-04.json",
        "steady_eager_h100_2026-12-05.json", "steady_eager_61rounds_h100_2026-12-05.json",
        "steady_eager_run2_h100_2026-12-05.json", "steady_eager_h200_2026-12-05.json",
        "steady_eager_401x2_h100_2026-12-05.json", "steady_eager_release_h100_2026-12-05.json",
        "steady_eager_release_run2_h100_2026-12-05.json", "steady_eager_release_run3_h100_2026-12-05.json",
        "steady_eager_release_run4_h100_2026-12-05.json", "steady_eager_release_run5_h100_2026-12-05.json",
        "steady_eager_512_h100_2026-12-05.json")
CASES = ("stack:1", "stack:64", "stack:512", "llama:64")
BEGIN, END = "<!-- models-table -->", "<!-- /models-table -->"
HEAD = ("| case | run | first call s: default / max-autotune | gemmtune cold (x max-autotune) "
        "| warm store (x default) | second start (x max-autotune's) | steady, x max-autotune: default / gemmtune "
        "| training step: gemmtune | eager warm-up + first forward s: cold / warm store / warm store with kernels "
        "| eager after warm-up, x plain eager |\n|---|---|---|---|---|---|---|---|---|---|")


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else a / b


def eager_ratio(steady: list[dict]) -> str:
    """`warmup` then eager over plain eager: the paired per-round ratio where the run kept it
    (`ratio_vs_eager`), with the A/A controls' where the run timed them (`eager_copy`, plain eager on
    another copy; `eager_late`, on a copy made after the warm-ups) and the bare-forward controls'
    (`eager_closure`, `eager_subclass`, `eager_lean`) and the warm-up with every layer kept patched
    (`eager_warmup_patched`), else "~" and the quotient of the two variants' medians of ratios to
    max-autotune."""
    rows = {r["variant"]: r for r in steady}
    warm, plain = rows.get("eager_warmup", {}), rows.get("eager", {})
    if warm.get("ratio_vs_eager") is not None:
        q = warm["ratio_vs_eager_q1_q3"]
        text = f"{warm['ratio_vs_eager']:.3f} ({q[0]:.3f}-{q[1]:.3f})"
        for variant, label in (("eager_copy", "A/A"), ("eager_late", "A/A late"), ("eager_closure", "closure"),
                               ("eager_subclass", "subclass"), ("eager_lean", "lean"),
                               ("eager_warmup_patched", "kept patched")):
            copy = rows.get(variant, {})
            if copy.get("ratio_vs_eager") is not None:
                c = copy["ratio_vs_eager_q1_q3"]
                text += f"; {label} {copy['ratio_vs_eager']:.3f} ({c[0]:.3f}-{c[1]:.3f})"
        return text
    derived = _ratio(warm.get("ratio_vs_max_autotune"), plain.get("ratio_vs_max_autotune"))
    return "-" if derived is None or math.isnan(derived) else f"~{derived:.3f}"


def row(case: dict, name: str) -> str | None:
    """The table row of one case of one run (None where the run has neither first calls nor steady rows)."""
    first = {r["variant"]: r.get("first_s") for r in case.get("first", [])}
    steady = {r["variant"]: r.get("ratio_vs_max_autotune") for r in case.get("steady", [])}
    if not any(v is not None for v in first.values()) and not any(v is not None for v in steady.values()):
        return None
    ma = first.get("max_autotune")
    cells = [
        f"{_num(first.get('default'), '.1f')} / {_num(ma, '.1f')}",
        f"{_num(first.get('gemmtune'), '.1f')} ({_num(_ratio(first.get('gemmtune'), ma), '.2f')})",
        f"{_num(first.get('gemmtune_store'), '.1f')} ({_num(_ratio(first.get('gemmtune_store'), first.get('default')), '.2f')})",
        _num(_ratio(first.get("gemmtune_again"), first.get("max_autotune_again")), ".2f"),
        f"{_num(steady.get('default'), '.3f')} / {_num(steady.get('gemmtune'), '.3f')}",
        _num(steady.get("gemmtune+train"), ".3f"),
        f"{_num(first.get('eager_warmup'), '.1f')} / {_num(first.get('eager_warmup_store'), '.1f')} / "
        f"{_num(first.get('eager_warmup_shared_store'), '.1f')}",
        eager_ratio(case.get("steady", [])),
    ]
    return f"| {case['case']} | `{name}` | " + " | ".join(cells) + " |"


def table(runs: tuple[str, ...] = RUNS, results: Path = RESULTS) -> str:
    """The markdown table of `runs` (file names under `results`), by case then run."""
    rows: dict[str, list[str]] = {c: [] for c in CASES}
    for name in runs:
        data = json.loads((results / name).read_text())
        for case in data["cases"]:
            line = row(case, name)
            if line is not None:
                rows.setdefault(case["case"], []).append(line)
    return "\n".join([HEAD, *(line for lines in rows.values() for line in lines)])


def write(path: Path, text: str) -> None:
    """Replace what is between the markers in `path` with `text`."""
    doc = path.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    path.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write the table into docs/MODELS.md and README.md")
    args = p.parse_args(argv)
    text = table()
    if args.write:
        for doc in (ROOT / "docs" / "MODELS.md", ROOT / "README.md"):
            write(doc, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
