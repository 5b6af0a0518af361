"""Model-pruned prescreening: a cost model drops binaries before anything is timed.

Stage 0 ranks every template binary (compile-time config) with an analytic cost model
(`gemmtune.search.cost_model.estimate_ms` unless `options.model` replaces it) and keeps the best
`options.stage0_n`, dealt round-robin over the templates' own rankings; prescreening then runs on the kept binaries plus every library kernel.
Binaries the model cannot describe (configs without Triton's BLOCK_M/N/K, num_stages and
num_warps: GEMV tiles, the CuTe DSL template's clusters) and library kernels are never pruned: they
are prescreened in full.  In the registry (`gemmtune.search.STRATEGIES`) stage 0, then prescreen's own
prune, is the strategy's `prune` (`model_prune`), which tune runs before compiling, so only kept binaries are built; off CUDA the registry's
`for_device` runs prescreen instead (the cost model describes NVIDIA GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..core.choices import Choice, Timing
from ..templates.padded import PREFIX
from .base import CostModel, Measure, ProblemDims, knob
from .prescreen import PRESCREEN_EFFORTS, PrescreenOptions, binaries, first_configs, prescreen


@dataclass(frozen=True)
class ModelPrunedOptions(PrescreenOptions):
    """What model_pruned reads: stage 0's knobs, then prescreen's (declared by `PrescreenOptions`).

    Example:
        >>> sorted(ModelPrunedOptions.knobs())[:4]
        ['configs_per_template', 'model', 'problem', 'stage0_n']
    """

    stage0_n: int | None = knob("binaries the cost model keeps before anything compiles (None: all)")
    model: CostModel | None = knob("the cost model (None: gemmtune.search.cost_model.estimate_ms)")
    problem: ProblemDims | None = knob("the problem's dimensions the cost model estimates for")


MODEL_PRUNED_EFFORTS = {name: {**PRESCREEN_EFFORTS[name], "stage0_n": n}
                        for name, n in (("quick", 8), ("default", 14), ("max", 14))}
"""Each effort's model_pruned knobs: prescreen's, and the binaries stage 0 keeps.  The efforts of
`gemmtune.core.settings` set the same `stage0_n` (tests/test_strategy_options.py holds them to it)."""

MODEL_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")
"""What the cost model reads: a Triton tile.  On the CuTe DSL template's space (stages, clusters) it
ranked badly (5.96% max regret with 20 kept, 7 shapes; docs/CUTLASS.md), so that space is prescreened."""


def modelled(choice: Choice) -> bool:
    """Whether the cost model can rank this choice's binary."""
    cfg = choice.config_dict
    return not choice.is_extern and all(k in cfg for k in MODEL_KEYS)


FP8_STAGE0_N = 20
"""The binaries stage 0 keeps at least of a float8 problem: the model ranks float8 tiles less well (replays of
the shipped H200 fp8 sweep, `gemmtune simulate`: 8.49 % max regret keeping 14, 0.75 % keeping 20)."""


def stage0(choices: Sequence[Choice], options: ModelPrunedOptions) -> list[Choice]:
    """The choices left after the cost model keeps the best `options.stage0_n` binaries (of a float8
    problem at least `FP8_STAGE0_N`).

    Example:
        >>> from gemmtune.core.choices import Choice, as_params
        >>> from gemmtune.search.base import ProblemDims
        >>> cfg = lambda bm: as_params(dict(BLOCK_M=bm, BLOCK_N=128, BLOCK_K=64, num_stages=4, num_warps=8))
        >>> cs = [Choice("t", "h", cfg(bm), family="t") for bm in (16, 128)] + [Choice("lib", None)]
        >>> kept = stage0(cs, ModelPrunedOptions(stage0_n=1, problem=ProblemDims(4096, 4096, 4096)))
        >>> [c.config_dict.get("BLOCK_M", "lib") for c in kept]
        [128, 'lib']
    """
    n = options.stage0_n
    if n is None:
        return list(choices)
    if options.problem is None:
        raise ValueError("model_pruned: stage0_n needs options.problem (ProblemDims(M, N, K, ...))")
    if options.model is None:
        from .cost_model import estimate_ms as model
    else:
        model = options.model
    p = options.problem
    n = max(n, FP8_STAGE0_N) if p.dtype_bytes == 1 else n
    scored = [(model(g[0].config_dict, p.M, p.N, p.K, dtype_bytes=p.dtype_bytes, batch=p.batch), key,
               g[0].template_uid) for key, g in binaries(choices).items() if modelled(g[0])]
    # Padded twins (`templates.padded`) are dealt their own `n`: the model cannot tell an aligned
    # problem's tile from a misaligned one's, so the two sets must not crowd each other out.
    keep: set = set()
    for padded in (False, True):
        keep |= _dealt([s for s in scored if s[2].startswith(PREFIX) == padded], n)
    return [c for c in choices if not modelled(c) or c.binary_key in keep]


def _dealt(scored: Sequence[tuple], n: int) -> set:
    """The best `n` binaries of `scored` ((estimate, binary key, template uid)).  The model ranks tiles, not
    templates: they are dealt round-robin from each template's own ranking, so every template (plain,
    split-K, TMA) reaches prescreening."""
    per_template: dict[str, list] = {}
    for score, key, uid in sorted(scored, key=lambda t: t[0]):  # stable: ties keep the template's order
        per_template.setdefault(uid, []).append(key)
    keep: set = set()
    ranks = list(per_template.values())
    for i in range(max((len(r) for r in ranks), default=0)):
        for ranked in ranks:
            if i < len(ranked) and len(keep) < n:
                keep.add(ranked[i])
    return keep


def model_pruned(choices: Sequence[Choice], measure: Measure, options: ModelPrunedOptions) -> list[Timing]:
    """Stage 0 (cost model, nothing timed), then `prescreen` on what it kept.

    Example:
        >>> from gemmtune.core.choices import Choice, as_params
        >>> from gemmtune.search.base import ProblemDims
        >>> cfg = lambda bm: as_params(dict(BLOCK_M=bm, BLOCK_N=128, BLOCK_K=64, num_stages=4, num_warps=8))
        >>> cs = [Choice("t", "h", cfg(bm), family="t") for bm in (16, 64, 128)]
        >>> timed = []
        >>> opts = ModelPrunedOptions(stage0_n=2, problem=ProblemDims(4096, 4096, 4096))
        >>> _ = model_pruned(cs, lambda cc, st: timed.extend(cc) or [1.0] * len(cc), opts)
        >>> sorted(c.config_dict["BLOCK_M"] for c in timed)
        [64, 128]
    """
    return prescreen(model_prune(choices, options), measure, options)


def model_prune(choices: Sequence[Choice], options: ModelPrunedOptions) -> list[Choice]:
    """model_pruned's prune: stage 0, then prescreen's own prune (`options.configs_per_template`)."""
    return first_configs(stage0(choices, options), options)
