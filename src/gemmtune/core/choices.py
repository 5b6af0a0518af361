"""Choice and Selection value objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import torch

from . import autocast
from .binding import first_call_binding
from .errors import InputError
from .layout import FixedLayout, FlexibleLayout

Params = tuple[tuple[str, Any], ...]


def as_params(mapping: Mapping[str, Any] | Params) -> Params:
    """Sorted, hashable (name, value) pairs from a mapping."""
    items = mapping.items() if type(mapping) is dict or isinstance(mapping, Mapping) else mapping
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
        return Choice(self.template_uid, self.src_hash, self.config, self.runtime, layout, self.family)

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


def library_like(choice: Choice) -> bool:
    """A library kernel, or a library kernel run on padded operands (`templates.padded`, a generated
    kernel by the final's rules): both always reach the final.

    Example:
        >>> library_like(Choice("aten_mm", None)), library_like(Choice("padded_aten_mm", "h"))
        (True, True)
        >>> library_like(Choice("padded_triton_mm", "h", family="triton"))
        False
    """
    # Not family "extern" alone: a Choice built without a family (a replayed row) defaults to it.
    return choice.is_extern or (choice.family == "extern" and choice.template_uid.startswith("padded_"))


def torch_op(choice: Choice) -> bool:
    """Whether `choice` is one of torch's own library ops (aten: cuBLAS, oneDNN), not NumPy's BLAS."""
    return choice.is_extern and choice.family == "extern"


def keep_only(key: str) -> Any:
    """A finalize hook (`gemmtune.tune(..., finalize=[...])`) that keeps the candidate whose key is `key`:
    a known pick built for new operands with nothing timed; where the problem does not offer it, torch's
    own op, else the pool's first candidate.

    Example:
        >>> a = Choice("aten_mm", None)
        >>> b = Choice("triton_mm", "ab12", as_params({"BLOCK_M": 64}), family="triton")
        >>> [c.template_uid for c in keep_only(b.key)(None, [a, b], "mm") + keep_only("x")(None, [b, a], "mm")]
        ['triton_mm', 'aten_mm']
    """
    return lambda ki, choices, op_name: ([c for c in choices if c.key == key]
                                         or [c for c in choices if torch_op(c)][:1] or list(choices)[:1])


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
    decided_by: str | None = None  # the second timer that decided a close call (None: the first timer alone)
    second_reading: str | None = None  # that close call's reading, in words

    @property
    def winner_ms(self) -> float | None:
        times = [t.ms for t in self.timings if t.choice == self.winner and t.ms is not None]
        return min(times) if times else None

    @property
    def n_choices(self) -> int:
        return len(self.timings)

    def __call__(self, *tensors: Any) -> Any:
        """Run the winner on operands of the problem it was tuned for (shapes, strides, dtypes, device).

        Operands of another problem raise InputError (the winner's kernel was built for this one: it
        would compute garbage of the wrong size); under `torch.autocast` the operands are first cast
        as torch would cast them, so the result has torch's dtype or the call is refused.

        Example:
            >>> import torch, gemmtune
            >>> a, b = torch.randn(8, 4), torch.randn(4, 6)
            >>> sel = gemmtune.tune("mm", a, b, backends=("extern",))
            >>> torch.allclose(sel(a, b), a @ b)
            True
            >>> sel(torch.randn(2, 4), b)
            Traceback (most recent call last):
            ...
            gemmtune.core.errors.InputError: mm(8x4, 4x6): this Selection was tuned for mat1 of shape (8, 4), strides (4, 1), torch.float32 on cpu; got shape (2, 4), strides (4, 1), torch.float32 on cpu: tune that problem (gemmtune.tune), or call gemmtune.mm, which tunes each problem it meets
        """
        if self.kernel is None:
            raise RuntimeError("this Selection has no kernel attached")
        if autocast.enabled() and self.problem.op != "scaled_mm" and autocast.active_for(tensors):
            cast = autocast.cast(tensors)
            if _operand_key(cast) != self._expected_key:
                raise InputError(self._mismatch(cast, torch.get_autocast_dtype(tensors[-2].device.type)))
            with autocast.disabled(cast):
                return self._run(*cast)
        if _operand_key(tensors) != self._expected_key:
            raise InputError(self._mismatch(tensors, None))
        return self._run(*tensors)

    @cached_property
    def _run(self) -> Callable[..., Any]:
        """`kernel`, bound to the tuned problem on the first call (`core.binding`), as the tuner timed it."""
        assert self.kernel is not None  # `__call__` checked
        return first_call_binding(self.kernel)

    @cached_property
    def _expected(self) -> tuple[tuple[str, tuple, tuple, Any, torch.device], ...]:
        """(argument name, shape, strides, dtype, device) of each operand of the tuned problem."""
        names = {"mm": ("mat1", "mat2"), "bmm": ("batch1", "batch2"), "addmm": ("input", "mat1", "mat2"),
                 "scaled_mm": ("a", "b", "scale_a", "scale_b", "bias")}
        return tuple((name, tuple(m.size), tuple(m.stride), m.dtype, torch.device(m.device))
                     for name, m in zip(names[self.problem.op], self.problem.operands))

    @cached_property
    def _expected_key(self) -> tuple:
        """What `_operand_key` gives for operands of the tuned problem."""
        return tuple(x for _, size, stride, dtype, device in self._expected
                     for x in (torch.Size(size), stride, dtype, device, False))

    def _mismatch(self, tensors: tuple, autocast_dtype: torch.dtype | None) -> str:
        """Why `tensors` are not operands of this Selection's problem."""
        head = f"{self.problem.describe()}: this Selection"
        fix = f"tune that problem (gemmtune.tune), or call gemmtune.{self.problem.op}, which tunes each problem it meets"
        if len(tensors) != len(self._expected):
            return f"{head} takes {len(self._expected)} operands, got {len(tensors)}"
        for t, (name, size, stride, dtype, device) in zip(tensors, self._expected):
            if not isinstance(t, torch.Tensor):
                return f"{head}: {name} must be a torch.Tensor, got {type(t).__name__}"
            if autocast_dtype is not None and t.dtype != dtype:
                return (f"{head} was tuned for {dtype}, but under torch.autocast the operands are cast to "
                        f"{autocast_dtype} as torch would cast them: tune under the same autocast, or call "
                        f"it outside autocast")
            if t.is_neg():
                return f"{head}: {name} is a lazy negation view (negative bit set); call .resolve_neg() first"
            if (t.shape, t.stride(), t.dtype, t.device) != (size, stride, dtype, device):
                return (f"{head} was tuned for {name} of shape {size}, strides {stride}, {dtype} on {device}; got "
                        f"shape {tuple(t.shape)}, strides {t.stride()}, {t.dtype} on {t.device}: {fix}")
        return f"{head}: the operands do not match the tuned problem"


def _operand_key(tensors: tuple) -> tuple | None:
    """Shape, strides, dtype, device and negative bit of each operand, in one flat tuple (None: not
    tensors, or not 2 to 5 of them).  Built inline: this is `Selection.__call__`'s per-call check."""
    try:
        if len(tensors) == 2:
            a, b = tensors
            return (a.shape, a.stride(), a.dtype, a.device, a.is_neg(), b.shape, b.stride(), b.dtype, b.device, b.is_neg())
        if len(tensors) == 3:
            c, a, b = tensors
            return (c.shape, c.stride(), c.dtype, c.device, c.is_neg(), a.shape, a.stride(), a.dtype, a.device,
                    a.is_neg(), b.shape, b.stride(), b.dtype, b.device, b.is_neg())
        if len(tensors) in (4, 5):  # scaled_mm's a, b, scale_a, scale_b[, bias]
            return tuple(x for t in tensors for x in (t.shape, t.stride(), t.dtype, t.device, t.is_neg()))
    except (AttributeError, TypeError, RuntimeError):  # not tensors, or tensors without strides (sparse)
        pass
    return None
