"""The one Settings object.  `GEMMTUNE_*` environment variables are read here only.

Every field carries a `Spec` (core/spec.py): its type, its parser from an environment string, its
valid values and a one-line doc.  `Settings(...)`, `Settings.from_env(...)` and `settings.with_(...)`
all validate through those specs, and docs/SETTINGS.md is generated from them (`core.settings_doc.settings_table`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .environment import (OTHER_VARIABLES, cache_dir, check_other_variables, check_runtime, check_store,  # noqa: F401
                          isolation_for, parse_runtime, runtime_pairs, warn_unknown)
from .errors import BackendError, SettingsError
from .secret import MIN_KEY_CHARS, Secret, parse_secret
from .spec import Spec

FAMILIES = ("extern", "numpy", "triton", "numba", "cutlass")
"""Backend family names accepted by `backends=`:

- ``extern``: torch's own library kernels (cuBLAS through aten on GPU; torch.mm/oneDNN on CPU)
- ``numpy``: NumPy's BLAS (CPU float32/float64): a library kernel on its own thread pool, which fights
  torch's for the cores; opt-in: only a `backends` naming it pools it (docs/ARCHITECTURE.md)
- ``triton``: the Triton GEMM template (NVIDIA GPUs)
- ``numba``: the JIT-compiled tiled CPU template
- ``cutlass``: NVIDIA's CuTe DSL Hopper kernels, nvidia-cutlass-operators (`gemmtune[cutlass]`; pooled by default for problems of 2048+ in every dimension)
"""

STRATEGY_NAMES = ("exhaustive", "prescreen", "model_pruned", "default", "budgeted")
"""The strategy names `strategy=` accepts.  Kept here (not read from gemmtune.search) because core/
imports no other sub-package; tests/test_settings.py checks it equals `gemmtune.search.STRATEGIES` and its `ALIASES`."""

EFFORT_NAMES = ("quick", "default", "max")
CPU_CANNOT_WIN = 2.0
"""CPU: a choice more than this many times slower than the fastest cannot win (another tile grouping moves a
numba kernel by 5-20%, noise rarely by 2x): a binary that much slower than the fastest at stage 1 skips
prescreen's stage 2 (`gemmtune.search.prescreen`), a finalist that much slower than the fastest finalist
the final's re-time (`gemmtune.measure.bench.Bench.retime`)."""
ISOLATION_MODES = ("auto", "subprocess", "off")
L2_FLUSH_MODES = ("read", "write")
"""How the GPU timer empties L2 before a timed run.  "write" zeroes a 2x-L2 buffer (what Triton's
do_bench does): L2 is then full of dirty lines, and the timed kernel pays for writing them back to
DRAM as it evicts them, about L2-size of write traffic, which a memory-bound kernel (decode-time
GEMV/GEMM) feels as 30-50% extra time.  "read" sums the buffer instead: L2 holds clean lines of
data no kernel uses, the state a kernel meets after reading a large weight.  See docs/ARCHITECTURE.md."""


def _families(backends: Any) -> tuple[str, ...]:
    """`backends` (a comma-separated string or a tuple/list of names) as a tuple; ValueError(problem)."""
    if isinstance(backends, str):
        backends = tuple(b.strip() for b in backends.split(",") if b.strip())
    elif not isinstance(backends, (tuple, list)) or not all(isinstance(b, str) for b in backends):
        raise ValueError(f"expected None, a string or a tuple of family names ({', '.join(map(repr, FAMILIES))}), "
                         f"got {type(backends).__name__} {backends!r}")
    backends = tuple(backends)
    unknown = [b for b in backends if b not in FAMILIES]
    if unknown or not backends:
        raise ValueError(f"unknown family {unknown or backends!r}; known families: {', '.join(FAMILIES)}")
    return backends


def check_backends(backends: Any) -> tuple[str, ...] | None:
    """Validate a backends argument; None means every family available on the device.

    Example:
        >>> check_backends("extern, triton"), check_backends(None)
        (('extern', 'triton'), None)
    """
    return None if backends is None else _SPECS["backends"].validate("backends", backends)


def _f(default: Any, spec: Spec) -> Any:
    """A dataclass field whose default is `default` and whose metadata holds its Spec."""
    return field(default=default, metadata={"spec": spec})


def _int(doc: str, lo: int, optional: bool = False) -> Spec:
    return Spec("int", doc, lo=lo, optional=optional)


def _pos(doc: str, optional: bool = False) -> Spec:
    """A finite float > 0 (a time or a budget: zero, negatives, NaN and infinities mean nothing)."""
    return Spec("float", doc, lo=0.0, lo_open=True, optional=optional)


def _bool(doc: str) -> Spec:
    return Spec("bool", doc)


def _choice(doc: str, choices: tuple[str, ...], error: type[Exception] = SettingsError) -> Spec:
    return Spec("choice", doc, choices=choices, error=error)


@dataclass(frozen=True)
class Settings:
    """Every knob of a tuning run, in one frozen object; docs/SETTINGS.md lists them all.

    Example:
        >>> s = Settings(strategy="exhaustive", top_x=3)
        >>> s.with_(top_x=7).top_x
        7
        >>> Settings.from_env({"GEMMTUNE_TOP_X": "5"}, finalists=2).top_x
        5
    """

    backends: tuple[str, ...] | None = _f(None, Spec(
        "choice", "backend families to tune (comma-separated); none: every family native to the device "
        "(numpy only when named; cutlass_operators from 2048 in every dimension)",
        choices=FAMILIES, optional=True, parser=str, checker=_families, type_text="families",
        range_note="any of " + ", ".join(FAMILIES), error=BackendError))
    strategy: str = _f("model_pruned", _choice(
        "search strategy; model_pruned: cost model first (stage 0), then prescreen", STRATEGY_NAMES, BackendError))
    top_x: int = _f(4, _int("prescreen: configs kept after stage 1 (evidence in docs/ARCHITECTURE.md)", 1))
    stage1_runtime: tuple[tuple[str, Any], ...] | None = _f(None, Spec(
        "text", "prescreen's stage-1 runtime values, e.g. swizzle=8; none: each template's data-chosen default",
        optional=True, parser=runtime_pairs, checker=check_runtime, type_text="NAME=INT,...",
        range_note="integers; names: group, swizzle"))
    effort: str = _f("default", _choice("preset applied under explicit settings (see the efforts below)",
                                        EFFORT_NAMES))
    budget_s: float | None = _f(None, _pos("wall-clock cap on one tune: stop, return the best so far, say so",
                                           optional=True))
    stage0_n: int | None = _f(14, _int("model_pruned: binaries the cost model keeps before anything compiles "
                                       "(none: no pruning; float8 problems keep at least 20)", 1, optional=True))
    budget_runs: int | None = _f(None, _int("stop after this many benchmark runs and return the best so far",
                                            1, optional=True))
    finalists: int = _f(3, _int("best choices re-timed interleaved before the pick (extern always added)", 1))
    finalist_rounds: int = _f(15, _int("interleaved rounds of the finalists' re-timing", 1))
    library_final: bool = _f(True, _bool("re-time a final whose finalists are all library kernels (off: their "
                                         "earlier timings rank them; no generated kernel is at stake)"))
    library_margin: float = _f(0.01, Spec(
        "float", "a generated kernel must beat the best library kernel by this fraction in the final",
        lo=0.0, hi=0.5, hi_open=True))
    second_timer_band: float = _f(0.1, Spec("float", "GPU: a generated pick within this fraction of the library kernel's time is decided again by a second timer (Triton's do_bench; CUDA-graph replay under l2_flush=write); 0: never", lo=0.0, hi=1.0))  # noqa: E501
    noise_limit: float = _f(0.25, Spec(
        "float", "CPU: a final whose timings spread more (IQR / median) is stored provisional and re-checked "
        "by the next tune", lo=0.0, lo_open=True))
    compile_timeout_s: float = _f(120.0, _pos("a compile taking longer fails that candidate"))
    compile_workers: int = _f(0, _int("compile processes; 0: one per CPU core (at most 32)", 0))
    overlap_compile: str = _f("auto", _choice(
        "time ready binaries while others compile; auto: on for isolated GPU tunes", ("auto", "on", "off")))
    compile_path: str = _f("inductor", _choice(
        "gemmtune.mm and patched layers under torch.compile: inductor: traced as the aten op, which Inductor "
        "builds from gemmtune's pick (gemmtune.inductor); traced: the pick's own kernel emitted at trace time",
        ("inductor", "traced")))
    check_correctness: bool = _f(True, _bool("compare each candidate's output with a reference before timing it"))
    isolation: str = _f("auto", _choice(
        "subprocess: checks and timings in a worker process; off: in-process; auto: subprocess on GPU",
        ISOLATION_MODES))
    run_timeout_s: float = _f(60.0, _pos("isolation: a choice whose run takes longer is a hang"))
    gpus: int | None = _f(None, _int("a suite, sweep or warm-up on CUDA uses at most this many of the visible GPUs, "
                                     "one worker each (docs/SCALE.md); 1: one GPU; none: all", 1, optional=True))
    config_space: str = _f("default", _choice("Triton config spaces; max: >= 100 configs per template",
                                              ("default", "max")))
    hopper_templates: bool = _f(True, _bool("the split-K and persistent-TMA templates (false: plain template only)"))
    preview_templates: bool = _f(False, _bool("templates not yet proven on a GPU (triton_scaled_tma, fp8)"))
    gpu_rep_ms: float = _f(10.0, _pos("per-choice timing budget on GPU (finalists are re-timed interleaved)"))
    count_host_overhead: bool = _f(True, _bool("GPU: a choice costs max(GPU time, host launch time), "
                                               "as in an eager loop"))
    launch_aware_final: bool = _f(True, _bool("GPU final: a generated kernel must save more GPU time per call than the "
                                              "host launch time it adds over the library kernel"))
    l2_flush: str = _f("read", _choice("GPU: evict L2 before each timed run by reading or zeroing a buffer",
                                       L2_FLUSH_MODES))
    cpu_rep_ms: float = _f(50.0, _pos("per-choice timing budget on CPU, at most (blocked_autorange's min_run_time; "
                                      "tiny kernels get 400 runs' worth, prescreening 40%; the finalists' "
                                      "interleaved re-timing gets as much each)"))
    cpu_configs: int | None = _f(4, _int("CPU prescreen: numba_mm tile configs tried, the first N of its "
                                         "sweep-ranked space (none: all)", 1, optional=True))
    min_reps: int = _f(5, _int("timed runs per choice at least", 1))
    max_reps: int = _f(50, _int("GPU: timed runs per choice at most (>= min_reps)", 1))
    report_rows: int = _f(20, _int("rows of the AUTOTUNE table the CLI prints", 0))
    verbose: bool = _f(False, _bool("not read by the tuner today (the CLI's -v turns on INFO logging)"))
    store: str | None = _f(None, Spec("text", "where picks are kept: a SQLite file path, memory (this process "
                                      "only), off (nothing kept), or a redis:// / rediss:// URL (docs/SCALE.md); "
                                      "none or default: store.sqlite in the cache dir",
                                      optional=True, checker=check_store,
                                      range_note="a file path, memory, off, default (any case) or a redis URL"))
    share_kernels: bool = _f(False, _bool("keep the picks' compiled Triton kernels in the store too, so that a "
                                          "machine sharing it loads them instead of compiling (docs/SCALE.md)"))
    store_key: Secret | None = _f(None, Spec(
        "text", "secret the machines sharing a store hold: entries are signed with it (HMAC-SHA256) and only "
        "entries that verify are read; several comma-separated (the first signs); never printed "
        "(docs/RELIABILITY.md)", optional=True, parser=parse_secret, checker=parse_secret, type_text="secret",
        range_note=f">= {MIN_KEY_CHARS} characters each"))
    store_shared: str = _f("auto", _choice(
        "stores whose picks are checked on first use in a process: auto: a redis store, and a SQLite file "
        "another user owns or may write; on: every store (docs/RELIABILITY.md)", ("auto", "on")))
    store_lock_timeout_s: float = _f(5.0, _pos("a SQLite store another process keeps locked is waited on this "
                                               "long, then picks are kept in memory"))
    triton_key_cache: bool = _f(True, _bool("keep Triton's hash of its own installation across processes, under a "
                                            "signature of its files' metadata (templates/triton/key_cache.py)"))
    distributed: str = _f("auto", _choice(
        "torch.distributed job: auto: each new problem tuned once in the job and shared with every rank; "
        "off: every rank tunes alone", ("auto", "off")))
    distributed_timeout_s: float = _f(600.0, _pos("a shared tune's exchange between ranks waits this long at most"))
    lookup_table: str | None = _f(None, Spec("text", "JSON table (or `gemmtune cache export` file) of pinned choices",
                                             optional=True))

    def __post_init__(self) -> None:
        # Validation and normalisation (int -> float, "a,b" -> ("a", "b"), path -> str) share one
        # path with from_env, so an argument and a variable with the same value fail the same way.
        # `Settings(effort="quick")` brings the preset: a field left at its default takes its value
        # (`with_` and `from_env` merge the preset themselves, and keep an explicit default value).
        effort = _SPECS["effort"].validate("effort", self.effort)
        for name, value in (EFFORTS[effort].changes().items() if effort in EFFORTS else ()):
            if getattr(self, name) == DEFAULTS[name]:
                object.__setattr__(self, name, value)
        for name, spec in _SPECS.items():
            value = getattr(self, name)
            checked = spec.validate(name, value)
            if checked is not value:
                object.__setattr__(self, name, checked)
        _check_relations(lambda name: getattr(self, name), lambda name: name,
                         lambda name: getattr(self, name) != DEFAULTS[name])

    def __repr__(self) -> str:
        """The dataclass's repr, with a store URL's user part and query hidden (a password can be there).

        Example:
            >>> "s3cret" in repr(Settings(store="redis://:s3cret@db:6379/0?prefix=a"))
            False
        """
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        if isinstance(self.store, str) and "://" in self.store:
            scheme, rest = self.store.split("://", 1)
            host = rest.rsplit("@", 1)[-1].split("?", 1)[0].split("#", 1)[0]
            shown["store"] = f"{scheme}://{'***@' if '@' in rest else ''}{host}{'?***' if '?' in rest else ''}"
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def with_(self, **changes: Any) -> "Settings":
        """A copy with `changes` applied and validated (an `effort` brings its preset under `changes`).

        Example:
            >>> Settings().with_(effort="quick", top_x=3).top_x, Settings().with_(effort="quick").top_x
            (3, 2)
        """
        merged = merge_effort(changes)
        return _preset_merged(lambda e: replace(self, **{**merged, "effort": e}), merged.get("effort", self.effort))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Build from `GEMMTUNE_<FIELD>` variables, then `overrides` (None values ignored) on top.

        An empty variable counts as unset.  Errors name the variable and its field.

        Example:
            >>> Settings.from_env({"GEMMTUNE_EFFORT": "quick", "GEMMTUNE_TOP_X": "3"}).top_x
            3
        """
        env = os.environ if env is None else env
        check_other_variables(env)
        warn_unknown(env, KNOWN_VARIABLES)
        values: dict[str, Any] = {}
        labels: dict[str, str] = {}
        for name, spec in _SPECS.items():
            var = env_var(name)
            raw = env.get(var)
            if raw is None or not raw.strip():
                continue
            labels[name] = f"{var} ({name})"
            try:
                parsed = spec.parse(raw)
            except ValueError as exc:
                raise spec.error(f"{labels[name]}: {exc}") from None
            values[name] = spec.validate(labels[name], parsed)
        explicit = {k: v for k, v in overrides.items() if v is not None}
        values.update(explicit)
        values = merge_effort(values, lambda name: labels.get(name, name) if name not in explicit else name)
        defaults = {f.name: f.default for f in fields(cls)}
        _check_relations(lambda name: values.get(name, defaults[name]),
                         lambda name: labels[name] if name in labels and name not in explicit else name,
                         lambda name: name in values)
        return _preset_merged(lambda e: cls(**{**values, "effort": e}), values.get("effort", "default"))


def _preset_merged(make: Callable[[str], "Settings"], effort: str) -> "Settings":
    """`make(effort)` for values that already hold their effort's preset (`merge_effort`): built under
    the default effort, so that the constructor does not apply the preset again over an explicit
    value that equals a field's default, then given its effort."""
    settings = make("default")
    object.__setattr__(settings, "effort", effort)
    return settings


_SPECS: Mapping[str, Spec] = MappingProxyType({f.name: f.metadata["spec"] for f in fields(Settings)})
"""Each Settings field's Spec, in field order."""
DEFAULTS: Mapping[str, Any] = MappingProxyType({f.name: f.default for f in fields(Settings)})  # the one place


KNOWN_VARIABLES = frozenset(["GEMMTUNE_" + name.upper() for name in _SPECS] + list(OTHER_VARIABLES))
"""Every `GEMMTUNE_*` variable gemmtune reads; any other is warned about (`SettingsWarning`)."""


def env_var(name: str) -> str:
    """The environment variable of a Settings field.

    Example:
        >>> env_var("top_x")
        'GEMMTUNE_TOP_X'
    """
    return "GEMMTUNE_" + name.upper()


def _check_relations(get: Callable[[str], Any], label: Callable[[str], str], given: Callable[[str], bool]) -> None:
    """Checks across fields (one field's spec cannot see another's value); the error names the field
    that was set (`given`), max_reps when both were."""
    low, high = get("min_reps"), get("max_reps")
    if high < low and given("min_reps") and not given("max_reps"):
        raise SettingsError(f"{label('min_reps')}: must be <= max_reps ({high}), got {low}")
    if high < low:
        raise SettingsError(f"{label('max_reps')}: must be >= min_reps ({low}), got {high}")


@dataclass(frozen=True)
class Effort:
    """A named preset: values applied under explicit settings.  A field left None keeps its default.

    Example:
        >>> EFFORTS["quick"].changes()["top_x"], EFFORTS["default"].changes()
        (2, {})
    """

    name: str
    summary: str
    strategy: str | None = None
    stage0_n: int | None = None
    top_x: int | None = None
    finalists: int | None = None
    config_space: str | None = None
    gpu_rep_ms: float | None = None
    cpu_rep_ms: float | None = None
    finalist_rounds: int | None = None
    cpu_configs: int | None = None
    library_final: bool | None = None

    def __post_init__(self) -> None:
        for name, value in self.changes().items():
            _SPECS[name].validate(f"effort {self.name}: {name}", value)

    def changes(self) -> dict[str, Any]:
        """The settings this preset sets."""
        return {f.name: getattr(self, f.name) for f in fields(self)[2:] if getattr(self, f.name) is not None}

    def describe(self) -> str:
        """Every preset field's value under this effort (its own or the default), for help texts.

        Example:
            >>> EFFORTS["max"].describe().split(", ")
            ['strategy=exhaustive', 'stage0_n=14', 'top_x=4', 'finalists=6', 'config_space=max', 'gpu_rep_ms=20', 'cpu_rep_ms=50', 'finalist_rounds=15', 'cpu_configs=4', 'library_final=true']
        """
        defaults = {f.name: f.default for f in fields(Settings)}
        values = {**{f.name: defaults[f.name] for f in fields(self)[2:]}, **self.changes()}
        return _assignments(values)


EFFORTS: Mapping[str, Effort] = MappingProxyType({e.name: e for e in (
    Effort("quick", "fewer binaries, finalists and timing", strategy="model_pruned", stage0_n=8, top_x=2,
           finalists=2, gpu_rep_ms=5.0, cpu_rep_ms=10.0, finalist_rounds=3, cpu_configs=2, library_final=False),
    # default: the field defaults, chosen from the replays in docs/ARCHITECTURE.md and the H200 runs.
    Effort("default", "the field defaults"),
    # Every choice of the "max" spaces (>= 100 configs per Triton template) is timed.
    Effort("max", "every config of the max spaces timed", strategy="exhaustive", finalists=6,
           config_space="max", gpu_rep_ms=20.0),
)})
"""The effort presets by name (`Settings(effort=...)`, `GEMMTUNE_EFFORT`, `--effort`)."""


def merge_effort(values: Mapping[str, Any], label: Callable[[str], str] = lambda name: name) -> dict[str, Any]:
    """`values` on top of the preset of `values["effort"]` (if any): explicit settings beat the preset.

    Example:
        >>> merge_effort({"effort": "quick", "top_x": 3})["top_x"], merge_effort({"effort": "quick"})["top_x"]
        (3, 2)
    """
    if "effort" not in values:
        return dict(values)
    name = _SPECS["effort"].validate(label("effort"), values["effort"])
    return {**EFFORTS[name].changes(), **values}


def effort_help() -> str:
    """One line per effort for `--effort` (generated from the presets, so it cannot drift)."""
    return "; ".join(f"{e.name}: {e.summary} ({e.describe()})" for e in EFFORTS.values())


def _assignments(values: Mapping[str, Any]) -> str:
    """"a=1, b=x" with floats in their shortest form."""
    return ", ".join(f"{k}={_default_text(v)}" for k, v in values.items())


def _default_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)
