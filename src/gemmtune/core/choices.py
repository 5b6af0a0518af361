"""Choice and Selection value objects."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from .layout import FixedLayout, FlexibleLayout

Params = tuple[tuple[str, Any], ...]


def as_params(mapping: Mapping[str, Any] | Params) -> Params:
    """Sorted, hashable (name, value) pairs from a mapping."""
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return tuple(sorted(items))


@dataclass(frozen=True)
class Choice:
    """One candidate kernel: template + compile-time config + runtime params.

    Runtime params are plain kernel arguments, so all choices with the same
    `binary_key` share one compiled binary.

    Example:
        >>> c = Choice("triton_mm", "ab12", as_params({"BLOCK_M": 64}), as_params({"swizzle": 8}))
        >>> c.binary_key, c.runtime_dict
        (('triton_mm', 'ab12', (('BLOCK_M', 64),)), {'swizzle': 8})
    """

    template_uid: str
    src_hash: str | None
    config: Params = ()
    runtime: Params = ()
    layout: FlexibleLayout | FixedLayout | None = field(default=None, compare=False)
    family: str = "extern"

    @property
    def is_extern(self) -> bool:
        return self.src_hash is None

    @property
    def config_dict(self) -> dict[str, Any]:
        return dict(self.config)

    @property
    def runtime_dict(self) -> dict[str, Any]:
        return dict(self.runtime)

    @property
    def binary_key(self) -> tuple:
        """Choices with equal keys run the same compiled binary."""
        return (self.template_uid, self.src_hash, self.config)

    @property
    def name(self) -> str:
        """Stable, human-readable name (template + config, no runtime params)."""
        if not self.config:
            return self.template_uid
        short = {"BLOCK_M": "bm", "BLOCK_N": "bn", "BLOCK_K": "bk", "num_stages": "s", "num_warps": "w"}
        return self.template_uid + "_" + "_".join(f"{short.get(k, k)}{v}" for k, v in self.config)

    @property
    def description(self) -> str:
        parts = [f"{k}={v}" for k, v in self.config] + [f"{k}={v}" for k, v in self.runtime]
        return ", ".join(parts)

    @property
    def key(self) -> str:
        """Unique text id of the choice, runtime params included."""
        rt = ",".join(f"{k}={v}" for k, v in self.runtime)
        return f"{self.name}[{rt}]" if rt else self.name

    def with_layout(self, layout: FlexibleLayout | FixedLayout) -> "Choice":
        return replace(self, layout=layout)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "template": self.template_uid, "src_hash": self.src_hash,
                "family": self.family, "config": self.config_dict, "runtime_params": self.runtime_dict}


@dataclass(frozen=True)
class Timing:
    """What the search learned about one choice."""

    choice: Choice
    ms: float | None
    stage: str  # "prescreen", "final", "finalist" or "skipped"
    status: str = "ok"  # "ok", "compile_failed", "wrong_result", "run_failed", "not_benchmarked"
    detail: str = ""
    gpu_ms: float | None = None  # GPU: kernel time by CUDA events (ms is max(gpu_ms, host_ms) by default)
    host_ms: float | None = None  # GPU: host time to launch one call
    spread: float | None = None  # CPU: IQR / median of the samples behind `ms` (None: unknown)


def library_reference(ranked: "Sequence[Choice]") -> Choice | None:
    """The library kernel a pick must beat: the fastest of torch's own ops (family "extern"), else the
    fastest library kernel (NumPy's BLAS where torch's op is not a candidate).

    Example:
        >>> aten, blas = Choice("aten_mm", None), Choice("numpy_blas", None, family="numpy")
        >>> library_reference([blas, aten]).template_uid, library_reference([blas]).template_uid
        ('aten_mm', 'numpy_blas')
    """
    return next((c for c in ranked if torch_op(c)), None) or next((c for c in ranked if c.is_extern), None)


def torch_op(choice: Choice) -> bool:
    """Whether `choice` is one of torch's own library ops (aten: cuBLAS, oneDNN), not NumPy's BLAS."""
    return choice.is_extern and choice.family == "extern"


@dataclass(frozen=True)
class Selection:
    """The outcome of tuning one problem.

    `kernel` runs the winner: `selection.kernel(*tensors)` returns the output.

    Example:
        >>> import torch, gemmtune
        >>> sel = gemmtune.tune("mm", torch.randn(32, 16), torch.randn(16, 8), backends=("extern",))
        >>> sel.layout.kind, sel.winner.is_extern
        ('flexible', True)
    """

    problem: Any  # KernelInputs
    winner: Choice
    timings: tuple[Timing, ...]
    layout: FlexibleLayout | FixedLayout
    strategy: str
    benchmark_runs: int
    compile_s: float
    benchmark_s: float
    prescreen_s: float
    tuning_s: float
    device_name: str
    kernel: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    out_layout: str = "row"
    cache_hit: bool = False  # the pick came from the store: nothing compiled but the winner, nothing timed
    from_store: int = 0  # timings recalled from the store
    stale_entries: int = 0  # stored timings ignored because the template's source changed
    binary_seconds: dict = field(default_factory=dict, compare=False, repr=False)  # binary_key -> compile s
    budget_exhausted: bool = False  # the time budget ran out: the winner is the best found so far
    isolation: str = "off"  # "subprocess" when candidates ran in a worker process
    overlapped: bool = False  # timing began while binaries were still compiling (compile_s overlaps the rest)
    noisy: bool = False  # the top finalists were within the timer's noise of each other: a tie
    provisional: bool = False  # decided under heavy noise: stored provisional, re-checked by a later tune
    background_load: float | None = None  # CPU: cores other processes kept busy while it was timed (None: unknown)

    @property
    def winner_ms(self) -> float | None:
        times = [t.ms for t in self.timings if t.choice == self.winner and t.ms is not None]
        return min(times) if times else None

    @property
    def n_choices(self) -> int:
        return len(self.timings)

    def __call__(self, *tensors: Any) -> Any:
        if self.kernel is None:
            raise RuntimeError("this Selection has no kernel attached")
        return self.kernel(*tensors)
