"""The final decision: from a strategy's ranking to the pick.

The best `finalists` choices, plus the best library kernel, are timed again interleaved (so drift
hits all alike) and the fastest wins, under rules that favour the library kernel (torch's own op
where it is a candidate: NumPy's BLAS, a library kernel on another thread pool, is held to the same
rules as a generated kernel):

- a generated kernel must beat it by `library_margin` in the final: a tie within the timer's noise
  goes to the library kernel (a near-equal pick measured again can land a few percent slower on
  10-20 us kernels; docs/ARCHITECTURE.md);
- host launch time (`count_host_overhead`) may only keep a slow launcher from winning: a kernel
  slower on the GPU than the library kernel never wins (on a slow host torch.mm's own dispatch can
  cost more than its kernel, and a CUDA graph pays GPU time only);
- launch-aware (`launch_aware_final`): on a GPU a generated kernel must also save more GPU time per
  call than the host launch time it adds (its `host_ms` over the library kernel's).  Back-to-back
  timing hides a launcher's host cost behind its kernel; an eager model that is launch-bound pays it
  in full (a Llama-shaped stack at 64 tokens ran 1.25x slower with Triton picks that saved no GPU time,
  docs/MODELS.md);
- a generated kernel must also beat it by more than the noise of the two timings (their relative
  spread, IQR / median of the runs, which both timers report): on a loaded CPU a descheduled thread
  adds whole scheduler ticks to some runs, and on a GPU a win smaller than its own readings' spread
  is no win either;
- on a GPU a close call is decided again by a second, independent timer (`_second_reading`).

`final_decision` also says whether the pick was a tie within the noise (`noisy`) and whether it is
`provisional` (CPU timings only): a close call (a tie within the noise) taken under heavy noise (a spread above
`noise_limit`), which the engine stores so that a later tune re-checks the pick instead of trusting
it for good.  A pick that beat every other finalist by more than the noise is firm even when the
spread is large (a finalist twice as slow is twice as slow), so on a quiet machine a second tune is
a plain cache hit.  A pick that is not
the library kernel and was not re-timed in the final together with it (a lone stage-1 time, a
budget that ran out before the re-time) is provisional too: one cheap run on a loaded CPU can read
10x fast, and such a time is never stored as a settled pick.

`final_pick` is pure over what it is handed, so the engine (a Bench's records and interleaved
re-time) and the offline replays (recorded times standing in for both) decide alike.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from ..core.choices import Choice, Timing, library_like, library_reference as reference, torch_op as _torch_op
from ..core.errors import NoCandidatesError
from ..core.settings import DEFAULTS as _DEFAULTS

Retime = Callable[[Sequence[Choice], int], "list[float]"]
"""`retime(choices, rounds) -> ms per choice`, timed interleaved; it may update the records it was given."""


@dataclass(frozen=True)
class FinalRule:
    """The rule of the final; its defaults are `gemmtune.Settings`' (`finalists`, `finalist_rounds`,
    `library_margin`, `noise_limit`, `launch_aware_final`, `library_final`), read from there.

    Example:
        >>> FinalRule(finalists=2) == FinalRule(2, rounds=15, library_margin=0.01, launch_aware=True)
        True
    """

    finalists: int = _DEFAULTS["finalists"]
    rounds: int = _DEFAULTS["finalist_rounds"]
    library_margin: float = _DEFAULTS["library_margin"]
    noise_limit: float = _DEFAULTS["noise_limit"]  # a final whose timings spread more than this is provisional
    launch_aware: bool = _DEFAULTS["launch_aware_final"]  # a generated kernel's GPU saving must exceed its added launch
    library_final: bool = _DEFAULTS["library_final"]  # re-time a final of library kernels only (quick effort: no)
    second_band: float = _DEFAULTS["second_timer_band"]  # a generated pick this close to the library: a second timer


@dataclass(frozen=True)
class Decision:
    """The final's pick, whether it was a tie within the noise, and whether it is provisional.

    Example:
        >>> Decision(Choice("aten_mm", None)).noisy
        False
    """

    choice: Choice
    noisy: bool = False  # the runner-up was within the timings' noise of the pick
    provisional: bool = False  # the finalists' timings spread more than `FinalRule.noise_limit`
    second: SecondReading | None = None  # the close call's second reading, where one was taken


@dataclass(frozen=True)
class SecondReading:
    """A close call read again by the second timer: its name, the generated finalist it was about, and
    that finalist's and the library kernel's milliseconds there.  `kept` says whether the finalist
    stood (else the library kernel was picked).

    Example:
        >>> r = SecondReading("do_bench", Choice("triton_mm", "h", family="triton"), 0.0103, 0.0100, False)
        >>> r.describe()
        'do_bench read triton_mm at 0.0103 ms, the library kernel at 0.0100 ms (1.030x): library kernel kept'
    """

    timer: str
    finalist: Choice
    finalist_ms: float
    library_ms: float
    kept: bool

    def describe(self) -> str:
        ratio = self.finalist_ms / self.library_ms if self.library_ms else float("inf")
        verdict = f"{self.finalist.template_uid} kept" if self.kept else "library kernel kept"
        return (f"{self.timer} read {self.finalist.template_uid} at {self.finalist_ms:.4f} ms, the library kernel "
                f"at {self.library_ms:.4f} ms ({ratio:.3f}x): {verdict}")


Second = Callable[[Sequence[Choice]], "tuple[str, list[float]] | None"]
"""`second(choices) -> (timer name, ms per choice)` from an independent timer, or None where there is none."""


def final_pick(ranked: Sequence[Timing], records: Mapping[Choice, Timing], retime: Retime, rule: FinalRule,
               *, budget_exhausted: bool = False, stored_pick: Choice | None = None, describe: str = "") -> Choice:
    """The pick among `ranked` (a strategy's ranking, fastest first): `final_decision`'s choice.

    `records` holds every timing of this problem (read after `retime`, for the GPU times it
    leaves there); `budget_exhausted` (a time budget ran out) skips the re-time; `stored_pick`, the
    pick remembered from an earlier tune, stands when nothing new reached the final.  `describe`
    names the problem in the NoCandidatesError raised when nothing produced a correct result.

    Example:
        >>> from gemmtune.core.choices import Choice, Timing
        >>> lib, gen = Choice("aten_mm", None), Choice("triton_mm", "h", family="triton")
        >>> times = {lib: 1.000, gen: 0.995}  # 0.5% faster: within the library margin
        >>> records = {c: Timing(c, ms, "final") for c, ms in times.items()}
        >>> ranked = [Timing(gen, 0.995, "final"), Timing(lib, 1.0, "final")]
        >>> retime = lambda cs, rounds: [times[c] for c in cs]
        >>> final_pick(ranked, records, retime, FinalRule(finalists=3, rounds=15, library_margin=0.01)).template_uid
        'aten_mm'
        >>> final_pick(ranked, records, retime, FinalRule(3, 15, library_margin=0.0)).template_uid
        'triton_mm'
    """
    return final_decision(ranked, records, retime, rule, budget_exhausted=budget_exhausted,
                          stored_pick=stored_pick, describe=describe).choice


def final_decision(ranked: Sequence[Timing], records: Mapping[Choice, Timing], retime: Retime, rule: FinalRule,
                   *, budget_exhausted: bool = False, stored_pick: Choice | None = None,
                   describe: str = "", second: Second | None = None) -> Decision:
    """`final_pick` with the noise verdicts: `noisy` (a tie within the spread of the re-timed
    finalists, which the library kernel keeps) and `provisional` (their spread exceeded
    `rule.noise_limit`).  `second` (the runner's second timer, `measure.second`) decides a close call:
    a generated pick within `rule.second_band` of the library kernel stands only if the second timer
    also has it beat the library kernel by the margin (`Decision.second` holds that reading).

    Example:
        >>> from gemmtune.core.choices import Choice, Timing
        >>> lib, gen = Choice("aten_mm", None), Choice("numba_mm", "h", family="numba")
        >>> records = {lib: Timing(lib, 1.0, "final"), gen: Timing(gen, 0.8, "final")}
        >>> def retime(cs, rounds):  # a loaded CPU: 20% faster, but the samples spread by 40%
        ...     for c in cs:
        ...         records[c] = Timing(c, records[c].ms, "finalist", spread=0.4)
        ...     return [records[c].ms for c in cs]
        >>> ranked = [Timing(gen, 0.8, "final"), Timing(lib, 1.0, "final")]
        >>> d = final_decision(ranked, records, retime, FinalRule(3, 15, 0.01))
        >>> d.choice.template_uid, d.noisy, d.provisional
        ('aten_mm', True, True)
    """
    ok = [m.choice for m in launch_ranked([records.get(m.choice, m) for m in ranked if m.ms is not None])]
    if not ok:
        raise NoCandidatesError(_nothing_correct(records, describe))
    finalists, best_extern = _finalists(ok, rule)
    if len(finalists) == 1:
        return Decision(finalists[0])
    if budget_exhausted:
        return Decision(finalists[0], provisional=_noise(records, finalists) > rule.noise_limit
                        or not _settled(finalists[0], best_extern, records))
    if stored_pick in finalists and all(records[c].stage == "store" for c in finalists):
        return Decision(stored_pick)  # nothing new reached the final: the stored decision stands
    if not rule.library_final and all(c.is_extern for c in finalists):  # no generated kernel at stake
        return Decision(finalists[0], provisional=_noise(records, finalists) > rule.noise_limit)
    pick, best_extern = _final_winner(finalists, ok, best_extern, records, retime, rule, describe)
    reading = _second_reading(pick, best_extern, records, second, rule)
    if reading is not None and not reading.kept:
        pick = best_extern  # type: ignore[assignment]
    # The noise that decided: the re-timed finalists' (on CPU a finalist twice as slow as the fastest is not
    # re-timed, `Bench.retime`, and its cheaper earlier timing says nothing about the pick); none: the pick's.
    decided = [c for c in finalists if records[c].stage == "finalist"] or [pick]
    tied = _tied(pick, finalists, records)
    # Heavy noise unsettles only a close call: a pick that beat every finalist by more than the noise stands.
    # (CPU timings only: a GPU's spread keeps a narrow win from beating the library kernel, `_beats`, but a
    # GPU pick is never provisional for it, so a warm store answers a GPU tune at once.)
    cpu = [c for c in decided if records[c].gpu_ms is None]
    loud = _noise(records, cpu) > rule.noise_limit and (tied or len(cpu) == 1)
    return Decision(pick, noisy=tied, provisional=loud or not _settled(pick, best_extern, records), second=reading)


def _finalists(ok: Sequence[Choice], rule: FinalRule) -> tuple[list[Choice], Choice | None]:
    """The best `rule.finalists` of `ok` plus the best library kernel and the best library kernel on
    padded operands (`library_like`), and that library kernel."""
    finalists, best_extern = list(ok[: rule.finalists]), reference(ok)
    twin = next((c for c in ok if library_like(c) and not c.is_extern), None)
    for extra in (best_extern, twin):
        if extra is not None and extra not in finalists:
            finalists.append(extra)
    return finalists, best_extern


def _second_reading(pick: Choice, library: Choice | None, records: Mapping[Choice, Timing], second: Second | None,
                    rule: FinalRule) -> SecondReading | None:
    """The second timer's reading of a close call: a generated `pick` whose final time is within
    `rule.second_band` of the library kernel's.  None where the call is not close or nothing can read it.

    Example:
        >>> lib, gen = Choice("aten_mm", None), Choice("triton_mm", "h", family="triton")
        >>> records = {lib: Timing(lib, 1.00, "finalist"), gen: Timing(gen, 0.95, "finalist")}
        >>> second = lambda cs: ("do_bench", [{lib: 1.0, gen: 1.02}[c] for c in cs])
        >>> _second_reading(gen, lib, records, second, FinalRule(second_band=0.1)).kept
        False
        >>> _second_reading(gen, lib, records, second, FinalRule(second_band=0.04)) is None  # 5% ahead: not close
        True
    """
    if second is None or library is None or pick == library or _torch_op(pick) or rule.second_band <= 0:
        return None
    mine, lib = records[pick].ms, records[library].ms
    if mine is None or lib is None or mine < lib * (1.0 - rule.second_band):
        return None
    answer = second([pick, library])
    if answer is None:
        return None
    timer, (p_ms, l_ms) = answer
    return SecondReading(timer, pick, p_ms, l_ms, kept=p_ms <= l_ms * (1.0 - rule.library_margin))


def _final_winner(finalists: list[Choice], ok: list[Choice], best_extern: Choice | None,
                  records: Mapping[Choice, Timing], retime: Retime, rule: FinalRule,
                  describe: str) -> tuple[Choice, Choice | None]:
    """The re-timed final's winner, and the library kernel it was held to.  A finalist the re-time found
    wrong (its timing came from the store and failed the check there, `Bench.retime`) is out."""
    times = retime(finalists, rule.rounds)
    right = lambda c: c not in records or records[c].status == "ok"  # noqa: E731
    ranked_final = [r for r in _final_order(finalists, times, records) if right(r[2])]
    if not ranked_final:
        raise NoCandidatesError(_nothing_correct(records, describe))
    if best_extern is not None and not right(best_extern):
        best_extern = reference([c for c in ok if right(c)])
    if best_extern is not None:  # a tie, or a kernel that beats no library kernel, goes to the library kernel
        lib = records[best_extern]
        ranked_final = [r for r in ranked_final if _torch_op(r[2]) or _beats(records[r[2]], lib, rule)] or [
            (lib.ms or 0.0, -1, best_extern)]
    return ranked_final[0][2], best_extern


def _final_order(finalists: Sequence[Choice], times: Sequence[float], records: Mapping[Choice, Timing]
                 ) -> list[tuple[float, int, Choice]]:
    """(re-timed ms, rank, choice) of the finalists, fastest first by `launch_key` (then their rank)."""
    final = [replace(records.get(c) or Timing(c, t, "finalist"), ms=t) for c, t in zip(finalists, times)]
    key = launch_key(final)
    order = sorted(range(len(finalists)), key=lambda i: (*key(final[i]), i))
    return [(times[i], i, finalists[i]) for i in order]


HOST_NOISE = 0.25
"""Host launch times up to this fraction above their template's median, and every one below it, are
that median (`launch_key`)."""


def launch_key(timings: Sequence[Timing], band: float = HOST_NOISE) -> Callable[[Timing], tuple[float, float]]:
    """The sort key of GPU timings whose cost counts the host (`count_host_overhead`): the cost with each
    host time below its template's median, or above it by at most `band` (`HOST_NOISE`; `math.inf`
    ties them all), taken as that median, then the GPU time.

    Every config of a template launches through the same launcher, so their host times differ by noise
    only; where a kernel runs shorter than its launch, the cost is that launch for all of them, and
    the raw costs ranked them by the host's noise.  Here they tie on the launch, and the fastest on
    the GPU comes first (no slower eagerly, faster where launches cost less: a compiled graph).  A
    host time far below the median is that noise too (one lucky reading, not a cheaper launcher), so
    it ties as well; one far above it keeps its own time, which may be a real cost.
    Timings without GPU and host times (CPU), or a set timed without counting the host, keep their
    `ms`.

    Example:
        >>> from gemmtune.core.choices import Choice
        >>> t = lambda cfg, gpu, host: Timing(Choice("triton_mm", "h", {"c": cfg}), max(gpu, host), "final",
        ...                                   gpu_ms=gpu, host_ms=host)
        >>> ts = [t(1, 0.010, 0.0172), t(2, 0.013, 0.0160), t(3, 0.030, 0.0168)]  # raw costs rank 2, 1, 3
        >>> [m.choice.config_dict["c"] for m in launch_ranked(ts)]  # 1 and 2 tie on the launch: 1 is faster
        [1, 2, 3]
        >>> lucky = [t(1, 0.010, 0.0200), t(2, 0.0119, 0.0135), t(3, 0.011, 0.0210)]  # 2's launch read low once
        >>> [m.choice.config_dict["c"] for m in launch_ranked(lucky)]  # all tie on the launch: by GPU time
        [1, 3, 2]
    """
    timed = [t for t in timings if t.ms is not None and t.gpu_ms is not None and t.host_ms is not None]
    counted = all(t.ms >= max(t.gpu_ms, t.host_ms) * (1 - 1e-9) for t in timed)  # type: ignore[operator, type-var]
    by_template: dict[str, list[float]] = {}
    for t in timed:
        by_template.setdefault(t.choice.template_uid, []).append(t.host_ms)  # type: ignore[arg-type]
    floors = {uid: statistics.median(hosts) for uid, hosts in by_template.items()}

    def key(t: Timing) -> tuple[float, float]:
        ms = float("inf") if t.ms is None else t.ms
        if not counted or t.gpu_ms is None or t.host_ms is None or t.ms is None:
            return ms, ms
        floor = floors.get(t.choice.template_uid, t.host_ms)
        host = floor if t.host_ms - floor <= band * floor else t.host_ms
        return max(t.gpu_ms, host), t.gpu_ms
    return key


def launch_ranked(timings: Sequence[Timing], band: float = HOST_NOISE) -> list[Timing]:
    """`timings` sorted by `launch_key` (stable: equal keys keep their order)."""
    key = launch_key(timings, band)
    return sorted(timings, key=key)


def _settled(pick: Choice, library: Choice | None, records: Mapping[Choice, Timing]) -> bool:
    """The pick is the best library kernel (or there is none), or both were re-timed in the final.

    Example:
        >>> lib, gen = Choice("aten_mm", None), Choice("numba_mm", "h", family="numba")
        >>> records = {lib: Timing(lib, 7.6, "final"), gen: Timing(gen, 0.5, "prescreen")}
        >>> _settled(gen, lib, records), _settled(lib, lib, records)
        (False, True)
    """
    if library is None or pick == library:
        return True
    return all(records[c].stage in ("finalist", "store") for c in (pick, library))


def _beats(gen: Timing, lib: Timing, rule: FinalRule) -> bool:
    """A generated kernel's final timing beats the library kernel's by the margin and by the noise."""
    keep = 1.0 - max(rule.library_margin, _noise_of(gen, lib))
    if gen.ms is None or lib.ms is None:
        return False
    if not (gen.ms <= lib.ms * keep and (lib.gpu_ms is None or (gen.gpu_ms or 0.0) <= lib.gpu_ms * keep)):
        return False
    return not rule.launch_aware or _saves_its_launch(gen, lib, keep)


def _saves_its_launch(gen: Timing, lib: Timing, keep: float) -> bool:
    """The GPU time `gen` saves per call exceeds the host launch time it adds (unknown times: it does).

    Example:
        >>> lib = Timing(Choice("aten_mm", None), 0.060, "finalist", gpu_ms=0.060, host_ms=0.012)
        >>> gen = Choice("triton_mm", "h", family="triton")
        >>> _saves_its_launch(Timing(gen, 0.059, "finalist", gpu_ms=0.059, host_ms=0.020), lib, 0.99)
        False
        >>> _saves_its_launch(Timing(gen, 0.050, "finalist", gpu_ms=0.050, host_ms=0.020), lib, 0.99)
        True
    """
    if None in (gen.gpu_ms, lib.gpu_ms, gen.host_ms, lib.host_ms):
        return True
    extra_host = max(0.0, gen.host_ms - lib.host_ms)  # type: ignore[operator]
    return gen.gpu_ms + extra_host <= lib.gpu_ms * keep  # type: ignore[operator]


def _tied(pick: Choice, finalists: Sequence[Choice], records: Mapping[Choice, Timing]) -> bool:
    """Another finalist's time lies within the pick's and its own noise of the pick's time."""
    mine = records[pick]
    for c in finalists:
        other = records[c]
        if c != pick and other.ms is not None and mine.ms is not None and other.ms != float("inf"):
            if abs(other.ms - mine.ms) <= min(other.ms, mine.ms) * _noise_of(mine, other):
                return True
    return False


def _noise_of(*timings: Timing) -> float:
    return max(((t.spread or 0.0) for t in timings), default=0.0)


def _noise(records: Mapping[Choice, Timing], finalists: Sequence[Choice]) -> float:
    """The largest relative spread among the finalists' timings (0 where none is known)."""
    return _noise_of(*(records[c] for c in finalists))


def _nothing_correct(records: Mapping[Choice, Timing], describe: str) -> str:
    failed = [t for t in records.values() if t.status != "ok"]
    if failed and all(t.status == "compile_failed" for t in failed):  # found out while timing (CompileJob)
        return f"{describe}: every candidate failed to compile: " + "; ".join(sorted({t.detail for t in failed}))[:500]
    failures = "; ".join(f"{t.choice.name}: {t.detail}" for t in failed)
    return f"{describe}: no candidate produced a correct result ({failures[:500]})"
