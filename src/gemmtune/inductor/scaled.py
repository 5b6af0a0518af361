"""`torch._scaled_mm` under `torch.compile`: Inductor's `tuned_scaled_mm` lowering answered as mm is.

Inductor lowers `aten._scaled_mm` in `tuned_scaled_mm` (`torch._inductor.kernel.mm`), which asks the
choices handler for its candidates under the op name "scaled_mm": the cuBLASLt extern
`aten::_scaled_mm` (its `out_dtype` and `use_fast_accum` passed as options) and, on a GPU, Inductor's
Triton templates: its mm template with the scales and the bias in the epilogue (`triton::mm`), and
TMA variants.  The installed handler (`inductor.handler`) hands such a call to `answer`:

- the call is read as gemmtune's scaled_mm problem (`scaled_problem`): the nodes' sizes, strides and
  dtypes, `out_dtype` and `use_fast_accum` (Inductor's own lookup key holds neither), checked by
  gemmtune's rules (`core.validate_fp8.check_rules`) and keyed by its `problem_key`;
- its pick is the handler's (made earlier in this process), else `gemmtune.tune` on stand-in tensors
  among `aten_scaled_mm` and (CUDA, capability >= 8.9) `triton_scaled_mm`, stored under the
  `inductor` tag, so a warm store answers without timing anything;
- Inductor builds it (`scaled_entries`): `aten_scaled_mm` as the `aten::_scaled_mm` extern,
  `triton_scaled_mm` as Inductor's own mm template for scaled_mm with the same tile and GROUP_M =
  swizzle (as a `triton_mm` pick is built for mm): one choice, nothing benchmarked.

A call gemmtune does not take (symbolic sizes, a float8 output, `scale_result`, a layout or dtype its
rules refuse, `_scaled_mm_v2`, an empty problem) keeps Inductor's own list, with one log line saying
why; so does one whose pick none of the call's templates can build (the library kernel stands in for
a Triton pick first, where it is offered).

Example:
    >>> import torch
    >>> from gemmtune.core.inputs import TensorMeta
    >>> meta = lambda size, stride, dt=torch.float8_e4m3fn: TensorMeta(size, stride, dt, "cuda:0")
    >>> one = meta((), (), torch.float32)
    >>> ki = KernelInputs("scaled_mm", (meta((64, 128), (128, 1)), meta((128, 32), (1, 128)), one, one),
    ...                   out_dtype=torch.bfloat16)
    >>> [e["template_id"] for e in scaled_entries(ki, Choice("aten_scaled_mm", None)).entries] if available() else ["aten::_scaled_mm"]
    ['aten::_scaled_mm']
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping, Sequence

import torch

from ..core.choices import Choice, Timing
from ..core.errors import InputError
from ..core.inputs import KernelInputs, TensorMeta, device_str
from ..core.validate_fp8 import check_rules
from .compat import available, inductor_templates  # noqa: F401 - `available` is used by the doctest
from .entries import InductorPick, entry_options, triton_entry
from .window import current_node

__all__ = ["OP", "LIBRARY", "TRITON", "lowering_missing", "note_lowering", "scaled_problem", "scaled_entries",
           "plan", "scaled_pool", "stand_ins", "answer"]

log = logging.getLogger("gemmtune")

OP = "scaled_mm"
LIBRARY = "aten_scaled_mm"
TRITON = "triton_scaled_mm"
POOL = {"cuda": (LIBRARY, TRITON)}  # the templates whose picks Inductor builds exactly; elsewhere the library


def lowering_missing() -> str | None:
    """Why this torch's Inductor cannot hand `_scaled_mm` to the handler (no `tuned_scaled_mm`, no
    `aten__fp8_mm` extern, no lowering registered); None when it can."""
    try:
        from torch._inductor import lowering
        from torch._inductor.kernel import mm
    except Exception as exc:  # noqa: BLE001 - an Inductor that fails to import
        return f"torch._inductor does not import ({type(exc).__name__}: {exc})"
    missing = [name for name in ("tuned_scaled_mm", "aten__fp8_mm") if getattr(mm, name, None) is None]
    if missing:
        return f"torch {torch.__version__} has no {' or '.join(missing)} in torch._inductor.kernel.mm"
    if torch.ops.aten._scaled_mm.default not in lowering.lowerings:
        return f"torch {torch.__version__} registers no Inductor lowering for aten._scaled_mm"
    return None


def note_lowering() -> bool:
    """Whether this torch's Inductor lowers `_scaled_mm` through the handler; one log line when not."""
    why = lowering_missing()
    if why is not None:
        log.info("gemmtune.inductor: %s: torch.compile's _scaled_mm calls are left to Inductor", why)
    return why is None


# -- the problem -------------------------------------------------------------------------------------

def _node_refusal(node: Any) -> str | None:
    """Why the FX node being lowered is not a `_scaled_mm` gemmtune takes (v2, `scale_result`); None if it is."""
    target = getattr(node, "target", None)
    if target is None:
        return None
    if "_scaled_mm_v2" in str(target):
        return f"{target} (scale recipes) is not aten._scaled_mm"
    if target is torch.ops.aten._scaled_mm.default:
        args, kwargs = tuple(getattr(node, "args", ())), dict(getattr(node, "kwargs", {}))
        if kwargs.get("scale_result", args[5] if len(args) > 5 else None) is not None:
            return "scale_result is given (gemmtune's scaled_mm has none)"
    return None


def _symbolic(kernel_inputs: Any) -> bool:
    dims = [d for group in (kernel_inputs.shapes_symbolic(), kernel_inputs.strides_symbolic()) for s in group for d in s]
    return not all(isinstance(d, int) or getattr(d, "is_Integer", False) for d in dims)


def _options(kernel_inputs: Any, overrides: Mapping[str, Mapping[str, Any]]) -> tuple[Any, Any]:
    """(out_dtype, use_fast_accum) of the call: the library extern's options where it is offered, else
    the output dtype of the kernel inputs and the Triton templates' USE_FAST_ACCUM (None: not known)."""
    aten = dict(overrides.get(str(inductor_templates().aten.get(OP)), {}))
    fast = aten.get("use_fast_accum", next((o["USE_FAST_ACCUM"] for o in overrides.values() if "USE_FAST_ACCUM" in o),
                                           None))
    if "out_dtype" in aten:
        return aten["out_dtype"], fast
    try:
        return kernel_inputs.out_dtype(), fast
    except Exception:  # noqa: BLE001 - kernel inputs of an Inductor without it
        return None, fast


def scaled_problem(kernel_inputs: Any, overrides: Mapping[str, Mapping[str, Any]] | None,
                   node: Any = None) -> KernelInputs | str:
    """gemmtune's scaled_mm problem behind one `tuned_scaled_mm` call (Inductor's `MMKernelInputs` of
    a, b, scale_a, scale_b[, bias] and the call's `kwarg_overrides`); a str saying why gemmtune does
    not take it.  `node`: the FX node being lowered, where known."""
    why = _node_refusal(node)
    if why is None and _symbolic(kernel_inputs):
        why = "symbolic sizes (dynamic shapes)"
    out_dtype, fast = _options(kernel_inputs, overrides or {})
    if why is None and not isinstance(fast, bool):
        why = "its use_fast_accum is not among the call's options"
    if why is not None:
        return why
    dev = device_str(kernel_inputs.device())
    metas = tuple(TensorMeta(tuple(sz), tuple(st), dt, dev) for sz, st, dt in
                  zip(kernel_inputs.shapes_hinted(), kernel_inputs.strides_hinted(), kernel_inputs.dtypes()))
    try:
        check_rules([torch.empty_strided(m.size, m.stride, dtype=m.dtype, device="meta") for m in metas],
                    out_dtype, fast)
    except InputError as exc:
        return str(exc)
    ki = KernelInputs(OP, metas, out_dtype=out_dtype, fast_accum=fast)
    return ki if ki.M > 0 else "an empty problem (M = 0)"


# -- entries -----------------------------------------------------------------------------------------

def _triton(ki: KernelInputs, config: Mapping[str, Any], runtime: Mapping[str, Any]) -> dict[str, Any]:
    """A `triton_scaled_mm` config as an entry of Inductor's mm template (which scaled_mm's heuristic
    gives the scales and bias as its epilogue): the tile, GROUP_M = swizzle, EVEN_K, USE_FAST_ACCUM."""
    return dict(triton_entry(ki, inductor_templates().triton_mm, config, runtime), USE_FAST_ACCUM=ki.fast_accum)


def scaled_entries(ki: KernelInputs, pick: Choice, measured: Iterable[Timing] = (), few: int = 2) -> InductorPick:
    """The Inductor entries of `pick`, the winner of the scaled_mm problem `ki`, under its `problem_key`.

    `aten_scaled_mm`: `aten::_scaled_mm`, exact.  `triton_scaled_mm` (a GPU problem): Inductor's mm
    template with its tile, exact.  Anything else (a template of `templates="all"` that Inductor has no
    counterpart of): the best `few` measured `triton_scaled_mm` configs and the library kernel, for
    Inductor to time (not exact)."""
    measured = list(measured)
    aten = {"template_id": inductor_templates().aten[OP]}
    uid, cfg, rt = pick.template_uid, pick.config_dict, pick.runtime_dict
    on_gpu = ki.device_type == "cuda"
    if uid == LIBRARY or uid == TRITON and on_gpu:
        entries, exact = [aten if uid == LIBRARY else _triton(ki, cfg, rt)], True
    else:
        timed = sorted((m for m in measured if m.choice.template_uid == TRITON and m.ms is not None),
                       key=lambda m: m.ms or 0.0)
        near = [_triton(ki, m.choice.config_dict, m.choice.runtime_dict) for m in timed][:few] if on_gpu else []
        entries, exact = [*near, aten], False
    source = " ".join([uid, *(f"{k}={v}" for k, v in cfg.items()), *(f"{k}={v}" for k, v in rt.items())])
    ms = min((m.ms for m in measured if m.choice.template_uid == uid and m.choice.config_dict == cfg
              and m.ms is not None), default=None)
    return InductorPick(OP, (ki.problem_key,), tuple(entries), exact, source, ki.describe(), ms, ki)


def plan(handler: Any, pick: InductorPick, offered: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(template uid, options) to build of `pick` among the `offered` templates ({uid: src_hash}): its
    first buildable entry when exact, else every buildable one; an entry whose template source changed
    is dropped with a warning (`handler._fresh`)."""
    out = []
    for entry in pick.entries:
        uid = str(entry.get("template_id"))
        if uid in offered and handler._fresh(entry, uid, offered[uid], OP, pick):
            out.append((uid, entry_options(entry)))
            if pick.exact:
                break
    return out


# -- tuning a miss -----------------------------------------------------------------------------------

def scaled_pool(device_type: str, templates: str, settings: Any) -> list:
    """The gemmtune templates that compete for a scaled_mm problem Inductor will build (`templates`:
    "inductor": those Inductor builds exactly; "all": every shipped one)."""
    from ..templates.registry import settings_pool

    pool = settings_pool(settings)
    keep = POOL.get(device_type, (LIBRARY,))
    return pool if templates == "all" else [t for t in pool if t.uid in keep]


def stand_ins(ki: KernelInputs, device: Any) -> tuple[torch.Tensor, ...]:
    """Real operands of the problem's sizes, strides and dtypes: float8 matrices from normal data,
    positive scales (about amax / 448 of such data), a normal bias.

    Example:
        >>> from gemmtune.core.inputs import TensorMeta
        >>> meta = lambda size, stride, dt=torch.float8_e4m3fn: TensorMeta(size, stride, dt, "cpu")
        >>> ki = KernelInputs("scaled_mm", (meta((4, 32), (32, 1)), meta((32, 16), (1, 32)),
        ...                   meta((4, 1), (1, 1), torch.float32), meta((1, 16), (16, 1), torch.float32)))
        >>> [(tuple(t.shape), t.stride(), t.dtype) for t in stand_ins(ki, "cpu")][1]
        ((32, 16), (1, 32), torch.float8_e4m3fn)
    """
    out = []
    for i, m in enumerate(ki.operands):
        span = 1 + sum((n - 1) * s for n, s in zip(m.size, m.stride) if n > 0)
        base = torch.randn(span, device=device)
        if i in (2, 3):
            base = base.abs() / 128 + 1 / 256
        out.append(base.to(m.dtype).as_strided(m.size, m.stride))
    return tuple(out)


def _tune(handler: Any, ki: KernelInputs, device: Any) -> InductorPick | None:
    """Tune a problem the handler has no pick for (the store answers a known one); None when tuning fails."""
    from torch.utils._python_dispatch import _disable_current_modes

    from ..core.settings import Settings
    from ..engine import tune

    settings = handler.settings or Settings.from_env()
    try:
        with _disable_current_modes(), torch.no_grad():
            sel = tune(OP, *stand_ins(ki, device), settings=settings, store_tag="inductor",
                       templates=scaled_pool(device.type, handler.templates, settings),
                       out_dtype=ki.out_dtype, use_fast_accum=ki.fast_accum)
    except Exception as exc:  # noqa: BLE001 - Inductor's own choices are a safe answer
        log.warning("gemmtune.inductor: tuning %s failed (%s: %s); Inductor chooses", ki.describe(),
                    type(exc).__name__, exc)
        handler.stats["scaled_mm_tune_failed"] += 1
        return None
    handler.stats["scaled_mm_tuned"] += 1
    handler.stats["scaled_mm_store_hit"] += bool(sel.cache_hit)
    pick = scaled_entries(ki, sel.winner, [t for t in sel.timings if t.status == "ok"])
    handler.add(pick)
    return pick


# -- the answer --------------------------------------------------------------------------------------

def _ktc(handler: Any, template: Any, kernel_inputs: Any, options: Mapping[str, Any],
         overrides: Mapping[str, Mapping[str, Any]]) -> Any:
    """One choice of `template`: its first heuristic config with the call's overrides (out_dtype,
    USE_FAST_ACCUM, ...) and `options` over it; None when the heuristic offers it nothing here."""
    from torch._inductor.kernel_template_choice import KernelTemplateChoice
    from torch._inductor.template_heuristics.params import DictKernelTemplateParams

    gen = handler.get_ktc(kernel_inputs, template, OP, dict(overrides.get(template.uid, {})))
    base = next(iter(gen), None)
    if base is None:
        return None
    return KernelTemplateChoice(template=base.template, params=DictKernelTemplateParams({**base.params.to_kwargs(),
                                                                                          **options}),
                                extra_kwargs=base.extra_kwargs, layout=base.layout, inputs=base.inputs)


def _build(handler: Any, pick: InductorPick, templates: Sequence[Any], kernel_inputs: Any,
           overrides: Mapping[str, Mapping[str, Any]]) -> list:
    """The pick's choices among the call's templates; the library kernel stands in where none of the
    pick's entries can be built (a Triton pick where Inductor offers no Triton template here)."""
    by_uid = {t.uid: t for t in templates}
    planned = plan(handler, pick, {uid: getattr(t, "src_hash", None) for uid, t in by_uid.items()})
    built = [(uid, opts, _ktc(handler, by_uid[uid], kernel_inputs, opts, overrides)) for uid, opts in planned]
    out = [(uid, opts, k) for uid, opts, k in built if k is not None]
    aten = inductor_templates().aten.get(OP)
    if not out and aten in by_uid and aten not in {uid for uid, _ in planned}:
        k = _ktc(handler, by_uid[aten], kernel_inputs, {}, overrides)
        if k is not None:
            handler.stats["scaled_mm_library_stand_in"] += 1
            out = [(str(aten), {}, k)]
    handler.built += [(OP, uid, dict(opts)) for uid, opts, _ in out]
    return [k for _, _, k in out]


def _own(handler: Any, own: tuple, what: str, why: str) -> list:
    """Inductor's own list for the call (`own`: `_inductors_own`'s arguments), with one log line saying why."""
    log.info("gemmtune.inductor: _scaled_mm %s left to Inductor: %s", what, why)
    handler.stats["scaled_mm_fallback"] += 1
    return handler._inductors_own(*own)


def answer(handler: Any, template_choices: Mapping[str, Any], kernel_inputs: Any, templates: list,
           kwarg_overrides: Mapping[str, Mapping[str, Any]] | None) -> list:
    """The handler's choices for one `tuned_scaled_mm` call (its `_finalize_template_configs`): the
    pick's, or Inductor's own list (never an error from here)."""
    own = (template_choices, kernel_inputs, templates, OP, kwarg_overrides)
    try:
        ki = scaled_problem(kernel_inputs, kwarg_overrides, current_node())
    except Exception as exc:  # noqa: BLE001 - inputs of a form this code does not know: Inductor's own list
        ki = f"its inputs could not be read ({type(exc).__name__}: {exc})"
    if isinstance(ki, str):
        return _own(handler, own, _shapes(kernel_inputs), ki)
    pick = handler.picks.get(ki.problem_key)
    if pick is None and handler.tune_on_miss:
        pick = _tune(handler, ki, kernel_inputs.device())
    if pick is None:
        handler.stats["scaled_mm_miss"] += 1
        return handler._inductors_own(*own)
    try:
        chosen = _build(handler, pick, templates, kernel_inputs, kwarg_overrides or {})
    except Exception as exc:  # noqa: BLE001 - e.g. a heuristic that refuses the options: Inductor's own list
        log.warning("gemmtune.inductor: building %s for %s failed (%s: %s)", pick.source, ki.describe(),
                    type(exc).__name__, exc)
        chosen = []
    if not chosen:
        return _own(handler, own, ki.describe(), f"none of this call's templates builds its pick ({pick.source})")
    handler.stats["scaled_mm_hit"] += 1
    return chosen


def _shapes(kernel_inputs: Any) -> str:
    try:
        return str([list(s) for s in kernel_inputs.shapes_hinted()])
    except Exception:  # noqa: BLE001 - only for the log line
        return "(sizes unknown)"
