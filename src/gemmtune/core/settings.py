"""The one Settings object.  `GEMMTUNE_*` environment variables are read here only."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from .errors import BackendError

FAMILIES = ("extern", "triton", "numba")
"""Backend family names accepted by `backends=`:

- ``extern``: library kernels (cuBLAS through aten on GPU; torch.mm/oneDNN and NumPy BLAS on CPU)
- ``triton``: the Triton GEMM template (NVIDIA GPUs)
- ``numba``: the JIT-compiled tiled CPU template
"""


def cache_dir() -> "Path":
    """`$GEMMTUNE_CACHE_DIR`, else `$XDG_CACHE_HOME/gemmtune`, else `~/.cache/gemmtune`."""
    from pathlib import Path

    env = os.environ.get("GEMMTUNE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gemmtune"


def check_backends(backends: Any) -> tuple[str, ...] | None:
    """Validate a backends tuple; None means every family available on the device."""
    if backends is None:
        return None
    from .validate import check_backends_arg

    check_backends_arg(backends)
    if isinstance(backends, str):
        backends = tuple(b.strip() for b in backends.split(",") if b.strip())
    backends = tuple(backends)
    unknown = [b for b in backends if b not in FAMILIES]
    if unknown or not backends:
        raise BackendError(f"backends: unknown family {unknown or backends!r}; known families: {', '.join(FAMILIES)}")
    return backends


ISOLATION_MODES = ("auto", "subprocess", "off")
L2_FLUSH_MODES = ("read", "write")
"""How the GPU timer empties L2 before a timed run.  "write" zeroes a 2x-L2 buffer (what Triton's
do_bench does): L2 is then full of dirty lines, and the timed kernel pays for writing them back to
DRAM as it evicts them, about L2-size of write traffic, which a memory-bound kernel (decode-time
GEMV/GEMM) feels as 30-50% extra time.  "read" sums the buffer instead: L2 holds clean lines of
data no kernel uses, the state a kernel meets after reading a large weight.  See docs/PERFORMANCE.md."""


def isolation_for(mode: str, device_type: str) -> str:
    """The isolation a tune on `device_type` uses: "auto" is "subprocess" on GPUs and "off" on CPU.

    Example:
        >>> isolation_for("auto", "cuda"), isolation_for("auto", "cpu"), isolation_for("off", "cuda")
        ('subprocess', 'off', 'off')
    """
    if mode == "auto":
        return "subprocess" if device_type == "cuda" else "off"
    return mode


EFFORTS: dict[str, dict[str, Any]] = {
    # default (the field defaults below): the cost model keeps 20 binaries of every template's space,
    # prescreen keeps 4, 3 finalists are re-timed interleaved (docs/PERFORMANCE.md has the H200 run).
    "quick": {"strategy": "model_pruned", "stage0_n": 8, "top_x": 2, "finalists": 2, "gpu_rep_ms": 5.0},
    "default": {},
    # Every choice of the "max" spaces (>= 100 configs per Triton template) is timed.
    "max": {"strategy": "exhaustive", "finalists": 6, "config_space": "max", "gpu_rep_ms": 20.0},
}


@dataclass(frozen=True)
class Settings:
    """Every knob of a tuning run, in one frozen object.

    Example:
        >>> s = Settings(strategy="exhaustive", top_x=3)
        >>> s.with_(top_x=7).top_x
        7
    """

    backends: tuple[str, ...] | None = None  # None: every family available on the device
    strategy: str = "model_pruned"  # GPUs: cost model first (stage 0), then prescreen; CPU: prescreen
    top_x: int = 4  # prescreen: configs kept after stage 1 (FACTS.md: X=5 had 0% regret, X=3 up to 1.2%)
    stage1_runtime: tuple[tuple[str, Any], ...] | None = None  # None: each template's data-chosen default
    effort: str = "default"  # quick | default | max: presets (EFFORTS) under explicit settings
    budget_s: float | None = None  # wall-clock cap on one tune: stop, return the best so far, say so
    stage0_n: int | None = 20  # model_pruned: binaries kept by the cost model before anything compiles
    budget_runs: int | None = None  # stop after this many benchmark runs and return the best so far
    finalists: int = 3  # best choices re-timed interleaved before the pick (extern always added)
    finalist_rounds: int = 15
    library_margin: float = 0.01  # a generated kernel must beat the best library kernel by this fraction in the final
    compile_timeout_s: float = 120.0
    compile_workers: int = 0  # 0: one per CPU core (at most 32)
    overlap_compile: str = "auto"  # time ready binaries while others compile: "auto" (isolated GPU tunes), "on", "off"
    check_correctness: bool = True
    isolation: str = "auto"  # "subprocess": checks and timings in a worker process; "off": in-process; "auto": subprocess on GPU
    run_timeout_s: float = 60.0  # isolation: a choice whose run takes longer is a hang
    config_space: str = "default"  # Triton config spaces: "default" or "max" (>= 100 configs per template)
    hopper_templates: bool = True  # the split-K and persistent-TMA templates (False: plain template only)
    preview_templates: bool = False  # templates not yet proven on a GPU (templates.PREVIEW_TEMPLATES; none today)
    gpu_rep_ms: float = 10.0  # per-choice timing budget on GPU (finalists are re-timed interleaved)
    count_host_overhead: bool = True  # GPU: a choice costs max(GPU time, host launch time), as in an eager loop
    l2_flush: str = "read"  # GPU: evict L2 before each timed run by reading ("read") or zeroing ("write") a buffer
    cpu_rep_ms: float = 200.0  # per-choice timing budget on CPU
    min_reps: int = 5
    max_reps: int = 50  # GPU: timed runs per choice at most (the interleaved final adds more where it matters)
    report_rows: int = 20
    verbose: bool = False
    store: str | None = None  # None: SQLite file in the cache dir; "memory": this process; "off": none; or a path
    lookup_table: str | None = None  # JSON table (or `gemmtune cache export` file) of pinned choices

    def with_(self, **changes: Any) -> "Settings":
        """A copy with `changes` applied and validated (an `effort` brings its presets)."""
        if "effort" in changes:
            changes = {**_effort(changes["effort"]), **changes}
        if "backends" in changes:
            changes["backends"] = check_backends(changes["backends"])
        return replace(self, **changes)

    def __post_init__(self) -> None:
        from ..search import STRATEGIES

        if self.strategy not in STRATEGIES:
            raise BackendError(f"strategy: unknown strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.top_x < 1:
            raise ValueError(f"top_x: must be >= 1, got {self.top_x}")
        if not 0.0 <= self.library_margin < 0.5:
            raise ValueError(f"library_margin: expected a fraction in [0, 0.5), got {self.library_margin}")
        if self.finalists < 1:
            raise ValueError(f"finalists: must be >= 1, got {self.finalists}")
        _effort(self.effort)
        if self.config_space not in ("default", "max"):
            raise ValueError(f"config_space: expected 'default' or 'max', got {self.config_space!r}")
        if self.l2_flush not in L2_FLUSH_MODES:
            raise ValueError(f"l2_flush: expected one of {', '.join(L2_FLUSH_MODES)}, got {self.l2_flush!r}")
        if self.overlap_compile not in ("auto", "on", "off"):
            raise ValueError(f"overlap_compile: expected auto, on or off, got {self.overlap_compile!r}")
        if self.isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation: expected one of {', '.join(ISOLATION_MODES)}, got {self.isolation!r}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise ValueError(f"budget_s: must be > 0 seconds, got {self.budget_s}")
        if self.compile_timeout_s <= 0:
            raise ValueError(f"compile_timeout_s: must be > 0, got {self.compile_timeout_s}")
        check_backends(self.backends)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Build from `GEMMTUNE_<FIELD>` variables (e.g. GEMMTUNE_TOP_X=7), then `overrides` (None values ignored)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get("GEMMTUNE_" + f.name.upper())
            if raw is None or f.name == "stage1_runtime":
                continue
            if f.name in ("stage0_n", "budget_runs", "store", "lookup_table", "budget_s"):
                conv = {"stage0_n": int, "budget_runs": int, "budget_s": float}.get(f.name, str)
                values[f.name] = _parse(f.name, raw, conv(1) if conv is not str else "")
                continue
            values[f.name] = _parse(f.name, raw, getattr(cls, f.name, None))
        raw_stage1 = env.get("GEMMTUNE_STAGE1_RUNTIME")
        if raw_stage1:
            values["stage1_runtime"] = parse_runtime(raw_stage1)
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "effort" in values:
            values = {**_effort(values["effort"]), **values}
        if "backends" in values:
            values["backends"] = check_backends(values["backends"])
        return cls(**values)


def _effort(name: str) -> dict[str, Any]:
    if name not in EFFORTS:
        raise ValueError(f"effort: unknown level {name!r}; use one of {', '.join(EFFORTS)}")
    return EFFORTS[name]


def parse_runtime(text: str) -> tuple[tuple[str, Any], ...]:
    """'swizzle=8' -> (('swizzle', 8),)."""
    out = []
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ValueError(f"stage1 runtime: expected NAME=VALUE, got {part!r}")
        k, v = part.split("=", 1)
        out.append((k.strip(), int(v)))
    return tuple(sorted(out))


def _parse(name: str, raw: str, default: Any) -> Any:
    if name == "backends":
        return raw
    try:
        if isinstance(default, bool):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError as exc:
        raise ValueError(f"GEMMTUNE_{name.upper()}: cannot parse {raw!r}") from exc
    return raw
