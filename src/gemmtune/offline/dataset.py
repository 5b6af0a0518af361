"""Datasets of recorded timings (`gemmtune sweep`) and their replay form.

Format `gemmtune-dataset/1` (JSONL, documented in docs/ARCHITECTURE.md): a `meta`
line, then one `shape` line per problem with every choice's time.  The
reference sweep format (docs/ARCHITECTURE.md: one record per shape with `shape`,
`cublas_ms`, `results`) is read by `load_reference_sweep`.
"""

from __future__ import annotations

import gzip
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..core.choices import Choice, as_params

FORMAT = "gemmtune-dataset/1"


@dataclass(frozen=True)
class ReplayShape:
    """Every recorded choice of one problem with its time (None: failed or wrong).  `problem` keys it
    (the record's `problem_key`: op, sizes, dtypes and, for scaled_mm, scales, output dtype and fast
    accumulation), so an fp8 problem and a bf16 one of the same M, K, N are two problems; `op` is its op."""

    shape: tuple[int, int, int]
    times: dict[Choice, float]
    name: str = ""
    compile_s: dict[tuple, float] = field(default_factory=dict)  # binary_key -> seconds
    failed: tuple[Choice, ...] = ()
    op: str = "mm"
    problem: str = ""

    @property
    def choices(self) -> list[Choice]:
        return list(self.times) + list(self.failed)

    @property
    def best_ms(self) -> float:
        return min(self.times.values())


def _open(path: str | Path):
    path = Path(path)
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def read_lines(path: str | Path) -> Iterator[dict[str, Any]]:
    with _open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def choice_from(rec: dict[str, Any]) -> Choice:
    return Choice(rec["template"], rec.get("src_hash"), as_params(rec.get("config", {})),
                  as_params(rec.get("runtime_params", {})), family=rec.get("family", "extern"))


def load_dataset(path: str | Path) -> tuple[dict[str, Any], list[ReplayShape]]:
    """(meta, shapes) from a gemmtune dataset or, detected by its first line, a reference sweep."""
    first = next(read_lines(path), None)
    if first is None:
        raise ValueError(f"dataset {path} is empty")
    if first.get("type") != "meta":
        return {"format": "reference-sweep", "source": str(path)}, load_reference_sweep(path)
    meta, shapes = first, []
    for rec in read_lines(path):
        if rec.get("type") != "shape":
            continue
        times, failed, compile_s = {}, [], {}
        for c in rec["choices"]:
            choice = choice_from(c)
            if c.get("ms") is not None and c.get("status", "ok") == "ok":
                times[choice] = c["ms"]
            else:
                failed.append(choice)
            if c.get("compile_s") is not None:
                compile_s[choice.binary_key] = c["compile_s"]
        shapes.append(ReplayShape((rec["M"], rec["K"], rec["N"]), times, rec.get("name", ""), compile_s, tuple(failed),
                                  rec.get("op", "mm"), problem_of(rec)))
    return meta, shapes


def problem_of(rec: dict[str, Any]) -> str:
    """A shape record's problem: its `problem_key`, else (a record written by hand) the problem its fields
    describe (`ProblemSpec.describe`); a ValueError names a record whose fields are no valid problem."""
    if rec.get("problem_key"):
        return str(rec["problem_key"])
    from .suite import ProblemSpec

    try:
        return ProblemSpec.from_record(rec).describe()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"dataset: shape {rec.get('name', '')!r} is no valid problem: {exc}") from None


def load_reference_sweep(path: str | Path) -> list[ReplayShape]:
    """Import the reference sweep format (docs/ARCHITECTURE.md) as replay shapes.

    Its plain Triton template becomes `triton_mm` choices (src_hash "reference":
    the recorded kernel's source is not ours), cuBLAS becomes `aten_mm`.
    """
    shapes = []
    for rec in read_lines(path):
        times: dict[Choice, float] = {}
        compile_s: dict[tuple, float] = {}
        for r in rec["results"]:
            bm, bn, bk, stages, warps = r["cfg"]
            cfg = as_params(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps))
            for sw, ms in r["ms"].items():
                if ms is not None:
                    c = Choice("triton_mm", "reference", cfg, as_params({"swizzle": int(sw)}), family="triton")
                    times[c] = ms
                    compile_s[c.binary_key] = r.get("compile_s", 0.0)
        cublas = rec.get("cublas_ms")
        if cublas:
            times[Choice("aten_mm", None)] = statistics.median(cublas) if isinstance(cublas, list) else cublas
        M, K, N = rec["shape"]
        shapes.append(ReplayShape((M, K, N), times, f"{M}x{K}x{N}", compile_s, problem=f"mm {M}x{K}x{N} bfloat16 B=row"))
    return shapes
