"""Prescreening with runtime parameters.

Stage 1 times every compile-time config at one runtime value; stage 2 times
every runtime value of the best `top_x` configs.  Library kernels skip stage 1
and always reach stage 2.  Stage-1 timings are reused, not repeated.  Stage 1 ranks
as the final does (`final.launch_ranked`): where a kernel runs shorter than its
launch, its cost is the launch, so the host's noise would rank the configs; they
tie on the launch instead and go by their GPU time.  A binary that one high host
reading kept out of the top `top_x` gets a second look in stage 2 (`second_looks`).

With `options.stage2_within` (the plan sets it on CPU) a binary slower at stage 1 than that many
times the fastest binary skips stage 2: another runtime value (numba's tile grouping moves a kernel by
5-20%) cannot make up a factor of two.  (The library kernels are not timed first for this: on CPU
NumPy's BLAS threads spin for a while after each call and would slow the numba kernels timed next.)  With
`options.configs_per_template` (the plan sets `Settings.cpu_configs` on CPU) prescreen's prune
keeps each template's first binaries in the template's own, data-ranked order.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..core.choices import Choice, Timing, library_like
from .base import Measure, Options, knob, ranking, recorded
from .final import launch_ranked


@dataclass(frozen=True)
class PrescreenOptions(Options):
    """What prescreen reads: its two stages' knobs and its prune's.

    Example:
        >>> PrescreenOptions.knobs()["top_x"]
        ('binaries kept after stage 1 for stage 2', 5)
    """

    top_x: int = knob("binaries kept after stage 1 for stage 2", 5)
    stage1: Mapping[str, Mapping[str, Any]] = knob("each template's stage-1 runtime values, by uid "
                                                   "(e.g. {'triton_mm': {'swizzle': 8}})", factory=dict)
    stage2_within: float | None = knob("stage 2 only for binaries within this factor of the fastest at stage 1 "
                                       "(None: the best top_x, however slow)")
    configs_per_template: int | None = knob("the prune: each template's first N binaries (None: all)")


PRESCREEN_EFFORTS = {"quick": {"top_x": 2}, "default": {"top_x": 4}, "max": {"top_x": 4}}
"""Each effort's prescreen knobs (the others keep their defaults; the plan sets stage1, stage2_within
and configs_per_template from the templates and the device).  The efforts of `gemmtune.core.settings`
set the same `top_x` (tests/test_strategy_options.py holds them to it)."""


def binaries(choices: Sequence[Choice]) -> dict[tuple, list[Choice]]:
    """Template choices grouped by the binary they share (insertion order kept); library kernels (padded
    ones too, `library_like`) are not among them: they skip stage 1 and are timed in stage 2."""
    groups: dict[tuple, list[Choice]] = defaultdict(list)
    for c in choices:
        if not library_like(c):
            groups[c.binary_key].append(c)
    return dict(groups)


def stage1_member(group: Sequence[Choice], stage1: Mapping[str, Any]) -> Choice:
    """The group's member whose runtime params match `stage1`, else the first."""
    for c in group:
        rt = c.runtime_dict
        if stage1 and all(rt.get(k) == v for k, v in stage1.items()):
            return c
    return group[0]


def prescreen(choices: Sequence[Choice], measure: Measure, options: PrescreenOptions) -> list[Timing]:
    """Two-stage search; returns every measured choice, fastest first.

    Example:
        >>> from gemmtune.core.choices import Choice, as_params
        >>> cs = [Choice("t", "h", as_params({"B": b}), as_params({"sw": s}), family="t")
        ...       for b in (1, 2, 3) for s in (1, 8)]
        >>> fake = {1: 3.0, 2: 1.0, 3: 2.0}
        >>> out = prescreen(cs, lambda cc, st: [fake[c.config_dict["B"]] * c.runtime_dict["sw"] for c in cc],
        ...                 PrescreenOptions(top_x=1, stage1={"t": {"sw": 8}}))
        >>> out[0].choice.config_dict, out[0].choice.runtime_dict
        ({'B': 2}, {'sw': 1})
    """
    groups = binaries(choices)
    externs = [c for c in choices if library_like(c)]  # every library kernel (padded ones too) reaches stage 2
    reps = [stage1_member(g, options.stage1.get(g[0].template_uid, {})) for g in groups.values()]
    # Stage 1: one runtime value per binary.
    stage1 = [Timing(c, ms, "prescreen") for c, ms in zip(reps, measure(reps, "prescreen"))]
    # Ranked as the final ranks (`final.launch_ranked`): kernels shorter than their launch tie on it and
    # go by their GPU time, not by the host's noise (where `measure` kept both readings).
    timed = recorded(measure, [m for m in stage1 if m.ms is not None])
    best = launch_ranked(timed)[: options.top_x]
    best += second_looks(timed, best, options.top_x)
    if options.stage2_within and best:
        fastest = min(m.ms for m in best if m.ms is not None)
        best = [m for m in best if m.ms is not None and m.ms <= options.stage2_within * fastest]
    best_keys = [m.choice.binary_key for m in best]

    # Stage 2: every runtime value of the kept binaries, plus the library kernels.
    done = {m.choice for m in stage1}
    todo = [c for key in best_keys for c in groups[key] if c not in done] + externs
    stage2 = [Timing(c, ms, "final") for c, ms in zip(todo, measure(todo, "final"))]
    kept = {m.choice for m in stage1 if m.choice.binary_key in best_keys}
    final = [Timing(m.choice, m.ms, "final") if m.choice in kept else m for m in stage1]
    return ranking(final + stage2)


def second_looks(timed: Sequence[Timing], best: Sequence[Timing], top_x: int) -> list[Timing]:
    """The binaries that a single high host reading kept out of `best`: those in the top `top_x` once
    every host time ties on its template's median (`launch_key` with an infinite band).  One reading
    per binary is all stage 1 has, and within a template every binary launches alike, so a host time
    far above the median is more likely noise than cost; stage 2 reads such a binary again (its other
    runtime values) instead of dropping it on that one reading.

    Example:
        >>> from gemmtune.core.choices import Choice, as_params
        >>> t = lambda b, gpu, host: Timing(Choice("t", "h", as_params({"B": b})), max(gpu, host), "prescreen",
        ...                                 gpu_ms=gpu, host_ms=host)
        >>> ts = [t(1, 0.010, 0.0230), t(2, 0.011, 0.0178), t(3, 0.012, 0.0180), t(4, 0.013, 0.0179)]
        >>> best = launch_ranked(ts)[:2]  # 1's host read 28 % above the median: it ranks last
        >>> [m.choice.config_dict["B"] for m in best], [m.choice.config_dict["B"] for m in second_looks(ts, best, 2)]
        ([2, 3], [1])
    """
    kept = {m.choice for m in best}
    return [m for m in launch_ranked(timed, band=math.inf)[:top_x] if m.choice not in kept]


def first_configs(choices: Sequence[Choice], options: PrescreenOptions) -> list[Choice]:
    """Prescreen's prune: with `options.configs_per_template` set, each template's first that many
    binaries, in the order the template lists them (numba_mm's is ranked by a sweep: docs/ARCHITECTURE.md,
    "The search"); every runtime value of a kept binary and every library kernel stay.

    Example:
        >>> from gemmtune.core.choices import Choice, as_params
        >>> cs = [Choice("t", "h", as_params({"B": b}), as_params({"sw": s}), family="t")
        ...       for b in (1, 2, 3) for s in (1, 8)] + [Choice("lib", None)]
        >>> [(c.config_dict.get("B"), c.runtime_dict.get("sw")) for c in first_configs(cs, PrescreenOptions(configs_per_template=1))]
        [(1, 1), (1, 8), (None, None)]
    """
    n = options.configs_per_template
    if n is None:
        return list(choices)
    firsts: dict[str, list[tuple]] = defaultdict(list)
    for key, group in binaries(choices).items():
        if len(firsts[group[0].template_uid]) < n:
            firsts[group[0].template_uid].append(key)
    keep = {key for keys in firsts.values() for key in keys}
    return [c for c in choices if library_like(c) or c.binary_key in keep]
