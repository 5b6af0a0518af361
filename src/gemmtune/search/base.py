"""What every search strategy receives and returns."""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, Callable, Mapping, NamedTuple, Sequence, TypeVar

from ..core.choices import Choice, Timing

O = TypeVar("O", bound="Options")

Measure = Callable[[Sequence[Choice], str], list["float | None"]]
"""`measure(choices, stage) -> ms per choice` (None: failed or wrong).  Every call is recorded; a
measure that keeps its readings in a `records` mapping (choice -> Timing with GPU and host times: tune's
`Bench`) lets a strategy rank by them (`recorded`)."""


class ProblemDims(NamedTuple):
    """The problem a model-based strategy estimates for: C[M,N] = A[M,K] @ B[K,N], `batch` times."""

    M: int
    N: int
    K: int
    batch: int = 1
    dtype_bytes: int = 2


CostModel = Callable[..., float]
"""`model(config, M, N, K, dtype_bytes, batch) -> estimated ms` (inf: cannot run); see gemmtune.search.cost_model."""


def knob(doc: str, default: Any = None, *, factory: Callable[[], Any] | None = None) -> Any:
    """A field of a strategy's options: its doc and its default (`factory` for a mutable one)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Options:
    """The base of every strategy's options: a frozen value whose fields are the strategy's knobs,
    each declared with `knob(doc, default)`.  A strategy owns its options type (`Strategy.options`),
    and sees only the knobs it reads; the plan (`gemmtune.pipeline.plan`) builds them.

    Example:
        >>> @dataclass(frozen=True)
        ... class Mine(Options):
        ...     width: int = knob("how many are kept", 3)
        >>> Mine.knobs(), Mine.from_values({"width": 5, "other": 1}).width
        ({'width': ('how many are kept', 3)}, 5)
    """

    @classmethod
    def knobs(cls) -> dict[str, tuple[str, Any]]:
        """Each knob's doc and default: name -> (doc, default)."""
        return {f.name: (f.metadata.get("doc", ""), _default(f)) for f in fields(cls)}

    @classmethod
    def from_values(cls: type[O], values: Mapping[str, Any]) -> O:
        """These options from `values`, taking only this strategy's knobs (the others are not its business)."""
        return cls(**{k: v for k, v in values.items() if k in cls.knobs()})

    def given(self: O, **values: Any) -> O:
        """A copy with those of `values` that are knobs of this strategy replaced; the rest ignored.

        Example:
            >>> Options().given(problem=None)
            Options()
        """
        mine = self.knobs()
        return replace(self, **{k: v for k, v in values.items() if k in mine})


def _default(f: Field) -> Any:
    return f.default_factory() if callable(f.default_factory) else f.default


Efforts = Mapping[str, Mapping[str, Any]]
"""A strategy's effort presets: effort name -> the knob values that effort sets."""


StrategyFn = Callable[[Sequence[Choice], Measure, Any], list[Timing]]
"""`search(choices, measure, options) -> ranking` (every measured choice, fastest first)."""

Prune = Callable[[Sequence[Choice], Any], list[Choice]]
"""`prune(choices, options) -> the choices worth compiling` (nothing is timed)."""


def keep_all(choices: Sequence[Choice], options: Options) -> list[Choice]:
    """The default `prune`: every choice is compiled and searched."""
    return list(choices)


@dataclass(frozen=True)
class Strategy:
    """A search strategy in two steps.  `prune` drops choices before anything is compiled or timed
    (model_pruned: the cost model's stage 0); `search` times what is left and ranks it.  The engine
    calls `prune` before compiling, so a pruned binary is never built, and then `search` on what
    compiled; calling the strategy itself does both, for offline replays and tests.

    `options` is the strategy's own options type (an `Options`): both steps refuse any other with a
    TypeError.  `efforts` maps an effort name (`gemmtune.core.settings.EFFORT_NAMES`) to the knob
    values that effort sets (`preset`); an effort it does not name keeps the knobs' defaults.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> def time_all(cs, measure, options):
        ...     return ranking([Timing(c, ms, "final") for c, ms in zip(cs, measure(cs, "final"))])
        >>> first = Strategy("first", time_all, pruner=lambda cs, options: list(cs[:1]))
        >>> cs = [Choice("a", None), Choice("b", None)]
        >>> [c.template_uid for c in first.prune(cs, Options())]
        ['a']
        >>> [m.choice.template_uid for m in first(cs, lambda cc, st: [1.0] * len(cc), first.preset("quick"))]
        ['a']
    """

    name: str
    searcher: StrategyFn
    pruner: Prune = keep_all
    options: type[Options] = Options
    efforts: Efforts = field(default_factory=dict)

    def __post_init__(self) -> None:
        for effort in self.efforts:
            self.preset(effort)  # an unknown effort or knob fails here, when the strategy is declared

    @property
    def knobs(self) -> dict[str, tuple[str, Any]]:
        """The options it reads: name -> (doc, default)."""
        return self.options.knobs()

    def preset(self, effort: str) -> Options:
        """The option set of `effort` (the knobs it does not set keep their defaults)."""
        from ..core.settings import EFFORT_NAMES

        if effort not in EFFORT_NAMES:
            raise ValueError(f"{self.name}: unknown effort {effort!r}; known: {', '.join(EFFORT_NAMES)}")
        return self.options(**self.efforts.get(effort, {}))

    def check(self, options: Any) -> None:
        """TypeError unless `options` are this strategy's own options type."""
        if type(options) is not self.options:
            raise TypeError(f"strategy {self.name!r} takes {self.options.__name__}, got {type(options).__name__}"
                            f" (each strategy has its own options type: Strategy.options)")

    def prune(self, choices: Sequence[Choice], options: Options) -> list[Choice]:
        """The choices worth compiling (nothing is timed)."""
        self.check(options)
        return self.pruner(choices, options)

    def search(self, choices: Sequence[Choice], measure: Measure, options: Options) -> list[Timing]:
        """Time `choices` through `measure` and rank them, fastest first."""
        self.check(options)
        return self.searcher(choices, measure, options)

    def __call__(self, choices: Sequence[Choice], measure: Measure, options: Options) -> list[Timing]:
        return self.search(self.prune(choices, options), measure, options)


def ranking(measured: Sequence[Timing]) -> list[Timing]:
    """Successful measurements, fastest first; failures last."""
    ok = sorted((m for m in measured if m.ms is not None), key=lambda m: m.ms or 0.0)
    return ok + [m for m in measured if m.ms is None]


def recorded(measure: Measure, measured: Sequence[Timing]) -> list[Timing]:
    """`measured` as `measure` recorded them (with their GPU and host times), where it keeps `records`;
    as they are otherwise.

    Example:
        >>> a = Choice("a", None)
        >>> class Kept:
        ...     records = {a: Timing(a, 2.0, "final", gpu_ms=1.0, host_ms=2.0)}
        ...     def __call__(self, choices, stage): return [2.0 for _ in choices]
        >>> recorded(Kept(), [Timing(a, 2.0, "prescreen")])[0].gpu_ms
        1.0
        >>> recorded(lambda choices, stage: [], [Timing(a, 2.0, "prescreen")])[0].gpu_ms is None  # no records
        True
    """
    records: Mapping[Choice, Timing] = getattr(measure, "records", None) or {}
    return [records.get(m.choice, m) for m in measured]
