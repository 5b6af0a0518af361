"""Installing the handler for `torch.compile`, and counting what Inductor benchmarks.

`install()` makes Inductor build gemmtune's pick for every mm / addmm / bmm it lowers, and for every
`torch._scaled_mm` (fp8; `inductor.scaled`: tuned by gemmtune, whatever `measure` says).  Its options:

- `table`: entries to start from (a JSON file or dict from `export_table`; stale ones are dropped
  with a warning).
- `tune_on_miss`: tune a problem the table lacks with `gemmtune.tune` (the store answers problems
  tuned before); False leaves misses to Inductor.
- `templates`: "inductor" (tune among the templates Inductor can build exactly) or "all".
- `all_threads`: the handler is set for this thread (`V.set_choices_handler`) and, with
  `all_threads` (the default), as `config.inductor_choices_class` (other threads; its `uuid()` keys
  Inductor's FX-graph cache, so a graph compiled without gemmtune is not reused).
- `fusion`: how a library pick meets the GEMM's pointwise epilogue, which only a Triton template can
  fuse.  "predict" (the default): where the GEMM has an epilogue and its best measured Triton config
  is predicted to win once the epilogue kernel it saves is counted (`entries.fuse_gain_ms`), that
  config is built instead, else the pick; one choice either way, nothing benchmarked.  A number N
  (max-autotune modes): the pick and its best N Triton configs, which Inductor benchmarks with the
  epilogue fused; 0: the pick alone.
- `measure`: on a GPU, "inductor" (the default) has Inductor time its own candidates for a problem
  the store does not know, once, and keeps the timings in the store (`inductor.timed`); "gemmtune"
  tunes it with gemmtune's own kernels instead (whose speed can differ from the Inductor kernel
  built from them).
- `shortlist`: with `measure="inductor"`, how many of each template's configs (ranked by gemmtune's
  cost model, `inductor.shortlist`) Inductor compiles and times for such a problem; None: all.
- `gemv`: in the default mode on a GPU, lower an `mm` whose M or N is 1 as max-autotune does, a
  multiply and a reduction (`inductor.gemv`), tuned by timing the reduction configs max-autotune
  tries ("autotune", the default: about 1.6 s more per cold compile on the stack at M = 1) or by
  coordinate descent from Inductor's default config (True: 14-22 s more); False keeps it a GEMM.
- `pipeline`: in the default mode on a GPU, time a graph's new problems together, by Inductor's
  pipelined GEMM autotuning: their compiles overlap each other and the rest of the compile, and one
  worker process times them one after another (`inductor.pipeline`); False (the default) times each
  while it is lowered.
- `m`: a GEMM whose M alone is symbolic (`dynamic=True`, `mark_dynamic` on the batch or sequence
  dimension) is tuned at every power-of-two bucket of M's range and compiled as one call that runs
  its M's bucket's pick (`inductor.dynamic`).  None (the default): M's bounds, an unbounded top taken as
  4096 or the traced size; a range, a list of M or "LO:HI": those buckets; False: tuned at the traced
  size alone, as Inductor does.
- `extern`: the templates whose pick Inductor cannot build and calls instead as gemmtune's own
  kernel, an extern call writing into Inductor's buffer (`inductor.extern`; default: the CUTLASS
  templates, which reach a compile with `templates="all", measure="gemmtune"`).

The configs Inductor times for the kernels it tunes (the reductions and multiplies above, and every
pointwise kernel under max-autotune) are kept in the handler's store and served to a new Inductor
cache, so a machine that shares the store compiles one config of each and times none
(`inductor.kernel_configs`).

It serves every `torch.compile` mode: in the default mode (and "reduce-overhead") a GPU GEMM's
lowering is offered Inductor's templates for its own duration (`inductor.window`), so a Triton pick
is built there too, with nothing benchmarked and the rest of the compile at default cost; under
"max-autotune" modes Inductor's own GEMM benchmarking is replaced by the picks.  `handler.stats`
counts hits, misses, tunes and stale entries; `uninstall()` restores what was there.  A program
Dynamo compiled before `install()` keeps its choices, and a later `torch.compile` of an equal model
in an equal mode may be served that program (`handler.stats` then stays empty): install first, or
`torch._dynamo.reset()`.  docs/RESULTS.md has the measurements.

Example:
    >>> import gemmtune.inductor as gi
    >>> if gi.available():
    ...     handler = gi.install(tune_on_miss=False)
    ...     gi.uninstall()
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import logging

from ..core.errors import InputError
from ..core.m_range import parse_m
from ..core.settings import Settings
from ..core.validate import check_flags, check_tune_options
from .compat import require
from .export import drop_stale, read_table
from .entries import FUSION, companions_for
from .dynamic import buckets_choice
from .extern import EXTERN_TEMPLATES, extern_choice
from .handler import is_gemmtune_handler, make_handler
from . import kernel_configs, pipeline
from .scaled import note_lowering
from .shortlist import SHORTLIST
from .window import open_window

__all__ = ["install", "uninstall", "installed", "ensure_installed", "sync_thread", "benchmark_probe", "BenchmarkProbe"]

log = logging.getLogger("gemmtune")
_PRIOR: list[tuple[Any, Any]] = []  # (config.inductor_choices_class, thread's handler) before each install
_ACTIVE: list[Any] = []  # the handler of each install, in step with _PRIOR


def install(table: str | Path | Mapping[str, list] | None = None, tune_on_miss: bool = True,
            settings: Settings | None = None, templates: str = "inductor", all_threads: bool = True,
            fusion: int | str = FUSION, measure: str = "inductor", shortlist: int | None = SHORTLIST,
            gemv: bool | str = "autotune", extern: Sequence[str] | None = None, pipeline: bool = False,
            m: Any = None) -> Any:
    """Make Inductor build gemmtune's pick for every mm / addmm / bmm / `_scaled_mm` it lowers; returns the handler.

    Its options (`table`, `tune_on_miss`, `templates`, `all_threads`, `fusion`, `measure`,
    `shortlist`, `gemv`, `extern`, `pipeline`, `m`) and the compile modes it serves: the docstring of
    `gemmtune.inductor.installer` and docs/MODELS.md.

    Raises InductorUnavailable when the installed torch has no Inductor lookup table.

    Example:
        >>> import torch, gemmtune.inductor as gi
        >>> handler = gi.install()                                          # doctest: +SKIP
        >>> f = torch.compile(lambda a, b: a @ b, fullgraph=True)          # any mode
        >>> y = f(torch.randn(64, 32), torch.randn(32, 16))                 # doctest: +SKIP
        >>> handler.stats["tuned"], gi.uninstall()                          # doctest: +SKIP
        (1, None)
    """
    require()
    from torch._inductor import config
    from torch._inductor.virtualized import V

    _check_options(templates, fusion, measure, shortlist, m, gemv)
    check_tune_options(settings=settings)
    check_flags("", False, tune_on_miss=tune_on_miss, all_threads=all_threads, pipeline=pipeline)
    loaded = drop_stale(read_table(table)) if table is not None else None
    handler = make_handler(loaded, tune_on_miss, settings, templates, fusion)
    handler.measure, handler.shortlist, handler.gemv, handler.pipeline = measure, shortlist, gemv, pipeline
    handler.extern, handler.m = _extern_option(extern), m
    if handler.extern:
        extern_choice()  # `extern_kernels.gemmtune_pick` exists before a graph from Inductor's cache calls it
    if m is not False:
        buckets_choice()  # likewise `extern_kernels.gemmtune_buckets`
    open_window(is_gemmtune_handler, sync_thread)
    kernel_configs.keep(handler._store)  # configs Inductor tunes for its own kernels, kept and served
    note_lowering()  # `_scaled_mm` is answered where this torch lowers it through the handler (inductor/scaled.py)
    from torch._inductor import virtualized

    prior_thread = virtualized._choices._get_handler(False)
    _PRIOR.append((config.inductor_choices_class, prior_thread))
    _ACTIVE.append(handler)
    if all_threads:
        config.inductor_choices_class = HandlerFactory(handler)
    V.set_choices_handler(handler)
    return handler


def _extern_option(extern: Sequence[str] | None) -> tuple[str, ...]:
    """`install(extern=...)` as a tuple of template uids (None: `inductor.extern.EXTERN_TEMPLATES`)."""
    if extern is None:
        return EXTERN_TEMPLATES
    if not isinstance(extern, (tuple, list)) or not all(isinstance(u, str) for u in extern):
        raise InputError(f"extern: expected a tuple or list of template names, got {extern!r}")
    return tuple(extern)


def _check_options(templates: str, fusion: int | str, measure: str, shortlist: int | None, m: Any = None,
                   gemv: bool | str = "autotune") -> None:
    """`install`'s options, each refused with an InputError (a ValueError) naming it before anything is
    installed."""
    if not (isinstance(gemv, bool) or gemv == "autotune"):
        raise InputError(f"gemv: expected True, False or 'autotune', got {gemv!r}")
    if m is not None and m is not False:
        parse_m(m, "install(m=...)")  # an InputError (a ValueError) naming the option
    if templates not in ("inductor", "all"):
        raise InputError(f"templates: expected 'inductor' or 'all', got {templates!r}")
    companions_for(fusion)  # a bad value is a ValueError here, not at the first GEMM
    if measure not in ("inductor", "gemmtune"):
        raise InputError(f"measure: expected 'inductor' or 'gemmtune', got {measure!r}")
    if shortlist is not None and (isinstance(shortlist, bool) or not isinstance(shortlist, int) or shortlist < 1):
        raise InputError(f"shortlist: expected an int >= 1 or None, got {shortlist!r}")


class HandlerFactory:
    """`config.inductor_choices_class` for an installed handler: calling it gives the handler.  It
    pickles as the handler's `uuid()`: torch versions that pickle the config for the FX-graph cache
    key (2.11 does) then cache graphs compiled with gemmtune instead of failing to pickle a closure.

    Example:
        >>> import pickle
        >>> class H:
        ...     def uuid(self): return "u1"
        >>> h = H()
        >>> import copy
        >>> HandlerFactory(h)() is h, pickle.loads(pickle.dumps(HandlerFactory(h))), copy.deepcopy(HandlerFactory(h))() is h
        (True, 'u1', True)
    """

    def __init__(self, handler: Any):
        self.handler = handler

    def __call__(self) -> Any:
        return self.handler

    def __reduce__(self) -> tuple:
        return (_handler_uuid, (self.handler.uuid(),))

    def __copy__(self) -> "HandlerFactory":  # torch copies config values: a copy is this factory, not its uuid
        return self

    def __deepcopy__(self, memo: dict) -> "HandlerFactory":
        return self


def _handler_uuid(uuid: str) -> str:
    """What a pickled `HandlerFactory` loads as: its handler's uuid (only the key's bytes matter)."""
    return uuid


def uninstall() -> None:
    """Put back the choices handler that was there before the last `install()` (no-op if none)."""
    if not _PRIOR:
        return
    from torch._inductor import config
    from torch._inductor.virtualized import V

    cls, handler = _PRIOR.pop()
    _ACTIVE.pop()
    pipeline.release()  # flags a failed pipelined compile may still hold
    kernel_configs.keep(_ACTIVE[-1]._store if _ACTIVE else None)
    config.inductor_choices_class = cls
    V.set_choices_handler(handler)


def sync_thread() -> None:
    """Bring this thread's choices handler up to date with `install()` / `uninstall()`.

    Inductor makes a thread's handler once, from `config.inductor_choices_class`, the first time the
    thread asks for it, and keeps it.  A backward graph is compiled in autograd's device thread, so a
    process that compiled a backward before `install()` would keep compiling backwards without gemmtune,
    and one that did after would keep gemmtune after `uninstall()`.  Here a handler Inductor made so (a
    plain `InductorChoices`, or one of an earlier config's class) gives way to the installed one, and a
    gemmtune handler no longer installed to what the config now gives.  A handler set for the thread on
    purpose (`V.set_choices_handler`, of another class) is left as it is.

    Example:
        >>> sync_thread()    # doctest: +SKIP
    """
    from torch._inductor import config, virtualized
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    here = getattr(virtualized.threadlocal, virtualized._choices._key, None)
    factory: Any = config.inductor_choices_class
    if here is None:  # not made yet: Inductor makes it from the config as it stands
        return
    if is_gemmtune_handler(here):
        if not any(here is h for h in _ACTIVE):  # uninstalled since this thread made it
            V.set_choices_handler(factory() if factory is not None else InductorChoices())
        return
    lazy = {InductorChoices, *(cls for cls, _ in _PRIOR if isinstance(cls, type))}
    if isinstance(factory, HandlerFactory) and type(here) in lazy:
        V.set_choices_handler(factory())


def ensure_installed() -> bool:
    """Install the handler with its defaults unless a gemmtune handler is installed already; False
    when this torch has no lookup table (nothing installed).  Called when a `gemmtune.mm`, `addmm`,
    `bmm` or patched layer is traced for Inductor, and by `warmup(..., for_compile=True)`.

    Example:
        >>> ensure_installed() in (True, False)   # doctest: +SKIP
        True
    """
    from ..core.errors import InductorUnavailable

    try:
        require()
    except InductorUnavailable:
        return False
    from torch._inductor import config
    from torch._inductor.virtualized import V

    sync_thread()  # a stale handler of this thread is not taken for an installed one
    factory: Any = config.inductor_choices_class
    if is_gemmtune_handler(V.choices) or isinstance(factory, HandlerFactory):
        if not is_gemmtune_handler(V.choices):  # installed for all threads, this thread's set on purpose
            V.set_choices_handler(factory())
        return True
    install()
    log.info("gemmtune.inductor: handler installed (a gemmtune GEMM was traced for Inductor): every mm / addmm "
             "/ bmm compiled in this process from now on builds gemmtune's pick")
    return True


@contextlib.contextmanager
def installed(table: str | Path | Mapping[str, list] | None = None, tune_on_miss: bool = True,
              settings: Settings | None = None, templates: str = "inductor", all_threads: bool = True,
              fusion: int | str = FUSION, measure: str = "inductor",
              shortlist: int | None = SHORTLIST, gemv: bool | str = "autotune",
              extern: Sequence[str] | None = None, pipeline: bool = False, m: Any = None) -> Iterator[Any]:
    """`install()` for the duration of a `with` block; yields the handler.

    Example:
        >>> import gemmtune.inductor as gi
        >>> with gi.installed(tune_on_miss=False) as h:   # doctest: +SKIP
        ...     pass
    """
    handler = install(table, tune_on_miss, settings, templates, all_threads, fusion, measure, shortlist, gemv, extern,
                      pipeline, m)
    try:
        yield handler
    finally:
        uninstall()


@dataclass
class BenchmarkProbe:
    """What Inductor benchmarked inside a `benchmark_probe()` block: `choices` timed one by one (in this
    process) and `autotuned` GEMMs it had to choose for (more than one choice)."""

    choices: int = 0
    autotuned: int = 0
    names: list = field(default_factory=list)


@contextlib.contextmanager
def benchmark_probe() -> Iterator[BenchmarkProbe]:
    """Count Inductor's autotuning benchmarks (`AlgorithmSelectorCache.benchmark_choice` calls, the
    timings its pipelined autotuning hands back from its worker, and the `select_algorithm_autotune`
    counter) while the block runs.

    Example:
        >>> import gemmtune.inductor as gi
        >>> with gi.benchmark_probe() as probe:   # doctest: +SKIP
        ...     compiled(x)
        >>> probe.choices                         # doctest: +SKIP
        0
    """
    from torch._dynamo.utils import counters
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    probe = BenchmarkProbe()
    original = AlgorithmSelectorCache.__dict__["benchmark_choice"]
    before = counters["inductor"]["select_algorithm_autotune"]

    def spy(cls: Any, choice: Any, autotune_args: Any) -> float:
        probe.choices += 1
        probe.names.append(getattr(choice, "name", str(choice)))
        return original.__func__(cls, choice, autotune_args)

    def pipelined(timings: dict) -> None:  # timed in Inductor's benchmark worker (inductor.pipeline)
        probe.choices += len(timings)
        probe.names += [getattr(c, "name", str(c)) for c in timings]

    AlgorithmSelectorCache.benchmark_choice = classmethod(spy)  # type: ignore[method-assign, assignment]
    if pipeline.available():
        pipeline.feed(pipelined)
    try:
        yield probe
    finally:
        AlgorithmSelectorCache.benchmark_choice = original  # type: ignore[method-assign]
        pipeline.unfeed(pipelined)
        probe.autotuned = counters["inductor"]["select_algorithm_autotune"] - before
