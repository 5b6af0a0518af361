"""tune(): one GEMM problem, end to end.  It reads as the list of its steps."""

from __future__ import annotations

import platform
import time
from typing import Any, Callable, Sequence

import torch

from . import heuristics
from .bench_runner import Bench, Listener
from .choices import Choice, Selection, Timing
from .compile import CompileResult, precompile
from .errors import InputError, NoCandidatesError
from .inputs import KernelInputs
from .measure import timer_for
from .settings import Settings
from .strategies import STRATEGIES, Measured, StrategyOptions
from .templates import active_templates
from .templates.base import Template


def tune(op: str, *tensors: torch.Tensor, device: str | torch.device | None = None,
         backends: Sequence[str] | None = None, strategy: str | None = None,
         settings: Settings | None = None, alpha: float = 1.0, beta: float = 1.0,
         finalize: Sequence[heuristics.FinalizeHook] = (), templates: Sequence[Template] | None = None,
         listener: Listener | None = None) -> Selection:
    """Tune one `mm`, `addmm` or `bmm` problem and return the Selection.

    `tensors` are the op's arguments in torch order (addmm: bias, mat1, mat2).
    `device` moves them first; `backends` is a tuple of family names from
    `gemmtune.FAMILIES` (`("extern",)`: library kernels only); `strategy` is
    `"prescreen"` (default) or `"exhaustive"`.

    Example:
        >>> import torch, gemmtune
        >>> a, b = torch.randn(64, 32), torch.randn(32, 16)
        >>> sel = gemmtune.tune("mm", a, b, backends=("extern",))
        >>> torch.allclose(sel(a, b), a @ b)
        True
    """
    started = time.perf_counter()
    settings = (settings or Settings.from_env()).with_(
        **{k: v for k, v in (("backends", backends), ("strategy", strategy)) if v is not None})
    tensors = _place(tensors, device)
    ki = KernelInputs.from_tensors(op, *tensors, alpha=alpha, beta=beta)
    _require_work(ki)
    emit = listener or (lambda event, **info: None)

    active = active_templates(ki, settings.backends, templates)
    choices = heuristics.get_template_configs(ki, active, op, finalize)
    if not choices:
        raise NoCandidatesError(f"{ki.describe()}: no template offers a candidate for "
                                f"{ki.dtype} on {ki.device} with backends={settings.backends}")
    emit("choices", total=len(choices), binaries=len({c.binary_key for c in choices}))

    compiled = precompile(choices, {t.uid: t for t in active}, ki, tensors,
                          timeout_s=settings.compile_timeout_s, workers=settings.compile_workers,
                          on_done=lambda done, total: emit("compile", done=done, total=total))
    runnable = [c for c in choices if compiled.launcher(c) is not None]
    if not runnable:
        raise NoCandidatesError(f"{ki.describe()}: every candidate failed to compile: "
                                + "; ".join(sorted(set(compiled.failures.values())))[:500])

    bench = Bench(ki, tensors, compiled, timer_for(ki.device, settings),
                  check_correctness=settings.check_correctness, listener=emit, total_hint=len(runnable))
    options = StrategyOptions(top_x=settings.top_x, stage1=_stage1(active, settings))
    ranked = STRATEGIES[settings.strategy](runnable, bench.measure, options)
    winner = _pick(ranked, bench, settings)
    return Selection(
        problem=ki, winner=winner, timings=_timings(choices, compiled, bench), layout=choices[0].layout,
        strategy=settings.strategy, benchmark_runs=bench.runs, compile_s=compiled.seconds,
        benchmark_s=bench.seconds.get("final", 0.0) + bench.seconds.get("finalist", 0.0),
        prescreen_s=bench.seconds.get("prescreen", 0.0), tuning_s=time.perf_counter() - started,
        device_name=device_name(ki.device), kernel=_kernel(winner, compiled))


# -- the steps ------------------------------------------------------------------------------

def _place(tensors: Sequence[Any], device: str | torch.device | None) -> tuple:
    if device is None:
        return tuple(tensors)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device: {device!r} requested but CUDA is not available here")
    return tuple(t.to(dev) if isinstance(t, torch.Tensor) else t for t in tensors)


def _require_work(ki: KernelInputs) -> None:
    dims = {"M": ki.M, "N": ki.N, "K": ki.K, "batch": ki.batch}
    empty = [f"{k}={v}" for k, v in dims.items() if v == 0]
    if empty:
        raise InputError(f"{ki.describe()}: nothing to tune, {', '.join(empty)} (the product is empty or all bias)")


def _stage1(templates: Sequence[Template], settings: Settings) -> dict[str, dict[str, Any]]:
    if settings.stage1_runtime is not None:
        return {t.uid: dict(settings.stage1_runtime) for t in templates}
    return {t.uid: dict(t.default_runtime) for t in templates}


def _pick(ranked: Sequence[Measured], bench: Bench, settings: Settings) -> Choice:
    """Re-time the best few, plus the best library kernel, interleaved; fastest wins."""
    ok = [m.choice for m in ranked if m.ms is not None]
    if not ok:
        failures = "; ".join(f"{t.choice.name}: {t.detail}" for t in bench.records.values() if t.status != "ok")
        raise NoCandidatesError(f"{bench.ki.describe()}: no candidate produced a correct result ({failures[:500]})")
    finalists = ok[: settings.finalists]
    best_extern = next((c for c in ok if c.is_extern), None)
    if best_extern is not None and best_extern not in finalists:
        finalists.append(best_extern)
    if len(finalists) == 1:
        return finalists[0]
    times = bench.retime(finalists, settings.finalist_rounds)
    return min(zip(times, range(len(finalists)), finalists))[2]


def _timings(choices: Sequence[Choice], compiled: CompileResult, bench: Bench) -> tuple[Timing, ...]:
    rows = []
    for c in choices:
        if c in bench.records:
            rows.append(bench.records[c])
        elif c.binary_key in compiled.failures:
            rows.append(Timing(c, None, "compile", "compile_failed", compiled.failures[c.binary_key]))
        else:
            rows.append(Timing(c, None, "skipped", "not_benchmarked"))
    return tuple(sorted(rows, key=lambda t: (t.ms is None, t.ms or 0.0)))


def _kernel(winner: Choice, compiled: CompileResult) -> Callable[..., torch.Tensor]:
    launch, rt = compiled.launcher(winner), winner.runtime_dict

    def kernel(*tensors: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return launch(tensors, out, **rt)

    return kernel


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine() or "cpu"
