"""Compiled GEMMs with a symbolic M: a pick per M bucket, chosen by the compiled graph at run time.

Under `torch.compile(dynamic=True)`, or `torch._dynamo.mark_dynamic` on the batch or sequence
dimension, Inductor lowers a GEMM whose M is a symbol and would tune it at one size (the first call's).
Where only M is symbolic in an `mm` or `addmm` (a symbol, or a product such as batch x tokens; N, K
and the strides otherwise fixed), the installed
handler instead tunes the problem at every power-of-two bucket of M's range (`core.m_range`: bucket `b`
holds M in (b/2, b], tuned at M = b: every fourth bucket and the last, then bisected where two tuned
neighbours pick different kernels (`refined`); the store answers buckets tuned before) and hands Inductor one
extern call, `extern_kernels.gemmtune_buckets`, whose entry lists each bucket's pick.

The range: `install(m=...)` (a range, a list of M or "LO:HI"); by default M's own bounds
(`mark_dynamic(t, 0, min=..., max=...)`), with an unbounded top taken as `DEFAULT_TOP` (or the size the
graph was traced at, where larger).  At run time each call finds its M's bucket (the nearest tuned one
outside the range, counted in `STATS["outside"]`), builds that bucket's pick once for the call's sizes
(nothing timed: its Triton binary is the bucket's, as `triton_mm` takes M at launch) and runs it into
Inductor's buffer.  The entry is untrusted input (it can come from Inductor's cache): `parse_table`
reads it strictly.  An epilogue is not fused into the call, as with the library kernel.

Example:
    >>> text = table_text("mm", 1.0, 1.0, {1: "aten_mm", 64: "triton_mm_bm64[swizzle=8]"})
    >>> op, alpha, beta, picks = parse_table(text)
    >>> op, picks[64], nearest(picks, 200)
    ('mm', 'triton_mm_bm64[swizzle=8]', 64)
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import Counter
from functools import lru_cache
from typing import Any, Callable

import torch

from ..core.binding import bound_to
from ..core.choices import keep_only
from ..core.inputs import KernelInputs, TensorMeta, device_str, stand_in
from ..core.m_range import MAX_M, bucket_of, buckets_for, parse_m
from .extern import handler_settings, kernel_choice, write_into
from .tuning import inductor_pool, scalars_of

__all__ = ["DYNAMIC_NAME", "DYNAMIC_UID", "DEFAULT_TOP", "table_text", "family_text", "parse_table", "nearest",
           "symbolic_m", "table_key", "bucket_range", "problem_at", "refined", "run_buckets", "buckets_choice",
           "forget", "tune_table", "answer", "reset", "STATS", "WANTED", "LATER"]

DYNAMIC_NAME = "gemmtune_buckets"
DYNAMIC_UID = "aten::" + DYNAMIC_NAME
DEFAULT_TOP = 4096
"""The top of an M range whose symbol has no upper bound (or the traced size, where larger)."""
MAX_TABLE_BYTES = 1 << 16
MAX_KERNELS = 8192  # kernels kept for calls' sizes; the oldest is dropped past it (rebuilt if met again)
log = logging.getLogger("gemmtune")
STATS: Counter = Counter()  # "tables", "builds", "outside", "wanted"
WANTED: dict[str, dict[int, tuple[TensorMeta, ...]]] = {}  # entry: {a bucket met outside its range: a call's operands}
LATER: dict[str, dict[int, str]] = {}  # entry: {such a bucket: its pick, tuned off the hot path (outside.tune_wanted)}

_KERNELS: dict[tuple, Callable[..., torch.Tensor]] = {}
_BY_M: dict[tuple[str, int], Callable[..., torch.Tensor]] = {}  # (entry, M): a bucket's pick that is torch's op
_LOCK = threading.Lock()


def reset() -> None:
    """Forget every kept kernel, marked bucket and later pick, and the counts (`STATS`).

    Example:
        >>> reset(); dict(STATS), WANTED, LATER
        ({}, {}, {})
    """
    with _LOCK:
        _KERNELS.clear()
        _BY_M.clear()
        WANTED.clear()
        LATER.clear()
        STATS.clear()


def table_text(op: str, alpha: float, beta: float, picks: dict[int, str], family: str = "") -> str:
    """The entry of a bucketed GEMM, as JSON: its op, scalars, `{bucket: choice key}` and `family` (the
    problem but M, `family_text`)."""
    return json.dumps({"op": op, "alpha": float(alpha), "beta": float(beta), "family": family,
                       "buckets": {str(b): k for b, k in sorted(picks.items())}}, sort_keys=True)


def family_text(shapes: Any, strides: Any, dtypes: Any, symbol: Any, device: Any) -> str:
    """A GEMM with M left out, as text: A's and B's sizes and strides (M's expression `symbol` spelled M,
    every other dimension a number: `symbolic_m`) and dtypes, as Inductor reports them while lowering,
    and the device: two GEMMs that differ there never share an entry, nor a kept kernel.

    Example:
        >>> M = "s0"   # a stand-in for M's symbol
        >>> family_text([(M, 7), (7, 9)], [(7, 1), (1, 7)], [torch.bfloat16] * 2, M, torch.device("cuda", 1))
        'A(M, 7) (7, 1) bfloat16; B(7, 9) (1, 7) bfloat16; on cuda:1'
    """
    spelled = lambda dims: "(" + ", ".join("M" if d == symbol else str(int(d)) for d in dims) + ")"  # noqa: E731
    operands = (f"{n}{spelled(shapes[i])} {spelled(strides[i])} {str(dtypes[i])[6:]}" for i, n in enumerate("AB"))
    return "; ".join((*operands, f"on {device}"))


@lru_cache(maxsize=256)
def parse_table(text: str) -> tuple[str, float, float, dict[int, str]]:
    """(op, alpha, beta, {bucket: choice key}) of a `table_text`; ValueError naming what is wrong.

    Example:
        >>> parse_table('{"op": "mm", "alpha": 1.0, "beta": 1.0, "family": "", "buckets": {"3": "aten_mm"}}')
        Traceback (most recent call last):
        ...
        ValueError: gemmtune bucketed GEMM entry: bucket '3' is not a power of two from 1 to 16777216
    """
    where = "gemmtune bucketed GEMM entry"
    if not isinstance(text, str) or len(text) > MAX_TABLE_BYTES:
        raise ValueError(f"{where}: expected JSON text of at most {MAX_TABLE_BYTES} bytes")
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"{where}: not JSON: {text[:80]!r}") from None
    if not isinstance(data, dict) or set(data) != {"op", "alpha", "beta", "buckets", "family"}:
        raise ValueError(f"{where}: expected the keys op, alpha, beta, buckets, family")
    if not isinstance(data["family"], str) or len(data["family"]) > 1024:
        raise ValueError(f"{where}: family must be text of at most 1024 characters")
    op, alpha, beta, buckets = data["op"], data["alpha"], data["beta"], data["buckets"]
    if op not in ("mm", "addmm") or not all(type(x) in (int, float) and _finite(x) for x in (alpha, beta)):
        raise ValueError(f"{where}: op must be mm or addmm and alpha, beta finite numbers")
    if op == "mm" and (alpha, beta) != (1, 1):
        raise ValueError(f"{where}: an mm has alpha = beta = 1")
    if not isinstance(buckets, dict) or not 0 < len(buckets) <= MAX_M.bit_length():
        raise ValueError(f"{where}: expected 1 to {MAX_M.bit_length()} buckets")
    picks = {}
    for b, key in buckets.items():
        if not (b.isascii() and b.isdigit() and 1 <= int(b) <= MAX_M and bucket_of(int(b)) == int(b)):
            raise ValueError(f"{where}: bucket {b!r} is not a power of two from 1 to {MAX_M}")
        if not isinstance(key, str) or not 0 < len(key) <= 1024:
            raise ValueError(f"{where}: bucket {b}'s pick is not a choice key")
        picks[int(b)] = key
    return op, float(alpha), float(beta), picks


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an integer too large for a float
        return False


def nearest(picks: dict[int, str], m: int) -> int:
    """The bucket of `m` where it was tuned, else the nearest tuned bucket (in powers of two, the larger on a tie)."""
    b = bucket_of(m)
    return b if b in picks else min(picks, key=lambda t: (abs(t.bit_length() - b.bit_length()), -t))


def symbolic_m(kernel_inputs: Any, op_name: str) -> Any:
    """M's expression (a symbol, or a product such as batch x tokens) in an mm or addmm whose B and K are
    fixed and whose every other symbolic size or stride is M itself (a column-major A's stride, a
    broadcast bias); else None (tuned at the traced size)."""
    if op_name not in ("mm", "addmm"):
        return None
    try:
        shapes, strides = kernel_inputs.shapes_symbolic(), kernel_inputs.strides_symbolic()
    except Exception:  # noqa: BLE001 - an Inductor without symbolic accessors: tuned at its hint
        return None
    symbolic = lambda x: bool(getattr(x, "free_symbols", None))  # noqa: E731
    m = shapes[-2][0]
    if not symbolic(m) or any(symbolic(x) for x in (*shapes[-1], *strides[-1], shapes[-2][1])):
        return None
    others = [x for dims in (*shapes, *strides) for x in dims if symbolic(x)]
    return m if all(x == m for x in others) else None


def table_key(kernel_inputs: Any, op_name: str) -> str:
    """The handler's key of a bucketed GEMM: the op, A's and B's symbolic sizes, strides and dtypes, the
    scalars (not the bias, which Inductor's calls for one addmm give in two forms) and the device."""
    shapes, strides = kernel_inputs.shapes_symbolic()[-2:], kernel_inputs.strides_symbolic()[-2:]
    return (f"{op_name} {shapes} {strides} {kernel_inputs.dtypes()[-2:]} {scalars_of(kernel_inputs)} "
            f"{kernel_inputs.device()}")


def bucket_range(symbol: Any, hint: int, wanted: Any = None) -> list[int]:
    """The buckets to tune for M's expression `symbol`: those of `wanted` (`install(m=...)`), else of its
    bounds (its symbols' `mark_dynamic(min=, max=)`), an unbounded top taken as max(`DEFAULT_TOP`, `hint`)."""
    if wanted is not None:
        return buckets_for(parse_m(wanted, "install(m=...)"))
    lo, hi = 1, None
    try:
        from torch._inductor.virtualized import V

        bounds = V.graph.sizevars.shape_env.bound_sympy(symbol)
        lo = max(1, int(bounds.lower))
        hi = int(bounds.upper) if bounds.upper.is_finite else None
    except Exception:  # noqa: BLE001 - no bounds known: the defaults
        pass
    top = min(MAX_M, hi if hi is not None else max(DEFAULT_TOP, hint))
    return buckets_for([min(lo, top), top])


def problem_at(kernel_inputs: Any, op_name: str, symbol: Any, m: int) -> KernelInputs:
    """Inductor's problem with M = `m`: every size and stride evaluated there."""
    at = lambda dims: tuple(int(x.subs(symbol, m)) if hasattr(x, "subs") else int(x) for x in dims)  # noqa: E731
    dev = device_str(kernel_inputs.device())
    metas = tuple(TensorMeta(at(sz), at(st), dt, dev) for sz, st, dt in zip(
        kernel_inputs.shapes_symbolic(), kernel_inputs.strides_symbolic(), kernel_inputs.dtypes()))
    return KernelInputs(op_name, metas, *scalars_of(kernel_inputs))


def _key(text: str, operands: Any) -> tuple:
    """A kept kernel's key from a problem's TensorMetas, equal to the one `run_buckets` spells from tensors."""
    a, b = operands[-2], operands[-1]
    key = (text, tuple(a.size), tuple(a.stride), tuple(b.stride))
    return key if len(operands) == 2 else (*key, tuple(operands[0].size), tuple(operands[0].stride), operands[0].dtype)


def register(text: str, operands: Any, kernel: Callable[..., torch.Tensor]) -> None:
    """Keep the kernel a bucket's tune compiled (`operands`: its problem's TensorMetas)."""
    with _LOCK:
        _keep(_key(text, operands), kernel)


def _keep(key: tuple, kernel: Callable[..., torch.Tensor], by_m: bool = True) -> None:
    """Keep `kernel` under `key` (`_key`); a pick (`by_m`) that is torch's op (`any_layout`) also under (entry,
    M) (`run_buckets`); the oldest dropped past `MAX_KERNELS`.  Under `_LOCK`."""
    _KERNELS[key] = kernel
    if by_m and (kernel is torch.mm or kernel is torch.addmm or getattr(kernel, "any_layout", False)):
        _BY_M[key[0], key[1][0]] = kernel
    for kept in (_KERNELS, _BY_M):
        while len(kept) > MAX_KERNELS:
            del kept[next(iter(kept))]


def forget(text: str, bucket: int) -> None:
    """Drop the kernels kept for an entry's calls whose M lies in `bucket` (a later pick serves it now)."""
    with _LOCK:
        for kept in (_KERNELS, _BY_M):
            for key in [k for k in kept if k[0] == text and bucket_of(k[1] if len(k) == 2 else k[1][0]) == bucket]:
                del kept[key]


def _build(text: str, tensors: tuple[torch.Tensor, ...], settings: Any, pool: Any) -> tuple[Callable, bool]:
    """The kernel of the call's bucket's pick for its sizes, and whether it is that pick (not torch's op standing
    in where the call's layout does not offer it): nothing timed, stored or shared (each rank meets its own M)."""
    from ..engine import tune

    op, alpha, beta, picks = parse_table(text)
    m, later = tensors[-2].shape[0], LATER.get(text, {})
    own = bucket_of(m)
    if not min(picks) <= own <= max(picks) and own not in later:  # the nearest bucket's pick; its own marked
        STATS["outside"] += 1
        STATS["wanted"] += own not in WANTED.setdefault(text, {})
        WANTED[text].setdefault(own, tuple(TensorMeta.of(t) for t in tensors))
    picks = {**picks, **later}
    bucket = nearest(picks, m)
    with torch.no_grad():
        sel = tune(op, *tensors, alpha=alpha, beta=beta, templates=pool, finalize=[keep_only(picks[bucket])],
                   settings=settings.with_(store="off", distributed="off"), progress=False)
    if sel.kernel is None:
        raise RuntimeError(f"gemmtune bucketed GEMM: {sel.problem.describe()}: no kernel to run")
    STATS["builds"] += 1
    return bound_to(sel.kernel, tensors), sel.winner.key == picks[bucket]


def run_buckets(*tensors: torch.Tensor, table: str, out: torch.Tensor) -> torch.Tensor:
    """What the compiled graph calls: the pick of the call's M bucket (`table`: `table_text`) into `out`.
    The kept kernel is found by the entry, A's size and stride and B's stride (the strides Inductor
    passes can differ from those it reported while lowering: a flexible buffer is laid out later), and
    an addmm's bias form; spelled out here, since it runs on every call.  A pick that is torch's op is
    found by the entry and M alone: it takes any layout of its operands, bias and output."""
    a, b = tensors[-2], tensors[-1]
    op = _BY_M.get((table, a.shape[0]))
    if op is not None:
        return op(*tensors, out=out)
    if len(tensors) == 2:
        key: tuple = (table, a.shape, a.stride(), b.stride())
    else:
        c = tensors[0]
        key = (table, a.shape, a.stride(), b.stride(), c.shape, c.stride(), c.dtype)
    kernel = _KERNELS.get(key)
    if kernel is None:
        if a.shape[0] == 0:  # a data-dependent M with no rows: nothing to write
            return out
        kernel = _kernel_for(key, table, tensors)
    if out.is_contiguous():
        return kernel(*tensors, out=out)
    return write_into(out, kernel, tensors)


def _kernel_for(key: tuple, table: str, tensors: tuple[torch.Tensor, ...]) -> Callable[..., torch.Tensor]:
    """A call's kernel, built once (`_build`) under the lock and kept (`_keep`)."""
    settings, templates = handler_settings()
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            kernel, pick = _build(table, tensors, settings, inductor_pool(tensors[-1].device.type, templates, settings))
            _keep(key, kernel, by_m=pick)
    return kernel


def buckets_choice() -> Any:
    """Inductor's `ExternKernelChoice` for `run_buckets`."""
    return kernel_choice(run_buckets, DYNAMIC_NAME)


def refined(buckets: list[int], pick_at: Callable[[int], str], step: int = 4) -> dict[int, str]:
    """`{bucket: pick}` for the buckets worth tuning: every `step`-th of `buckets` and the last, then, between
    two tuned neighbours whose picks differ, the middle bucket, again until neighbours agree or touch.
    A bucket left out lies between two that pick the same kernel, which `nearest` serves it.

    Example:
        >>> seen = []
        >>> picks = refined([1 << i for i in range(13)], lambda b: seen.append(b) or ("small" if b < 100 else "big"))
        >>> sorted(seen), picks[64], picks[128]
        ([1, 16, 64, 128, 256, 4096], 'small', 'big')
    """
    coarse = sorted(set(buckets[::step]) | {buckets[-1]})
    picks = {b: pick_at(b) for b in coarse}
    pending = list(zip(coarse, coarse[1:]))
    while pending:
        lo, hi = pending.pop()
        inner = [b for b in buckets if lo < b < hi]
        if picks[lo] != picks[hi] and inner:
            mid = inner[len(inner) // 2]
            picks[mid] = pick_at(mid)
            pending += [(lo, mid), (mid, hi)]
    return picks


def tune_table(kernel_inputs: Any, op_name: str, symbol: Any, wanted: Any, settings: Any,
               templates: str) -> tuple[str, int]:
    """Tune Inductor's problem at the buckets of M's range that `refined` asks for: (the entry's
    `table_text`, buckets the store answered)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from ..engine import tune

    hint = int(kernel_inputs.shapes_hinted()[-2][0])
    device = kernel_inputs.device()
    pool = inductor_pool(device.type, templates, settings)
    kernels, from_store = [], []

    def pick_at(b: int) -> str:
        ki = problem_at(kernel_inputs, op_name, symbol, b)
        with _disable_current_modes(), torch.no_grad():
            tensors = [stand_in(m.size, m.stride, m.dtype, device) for m in ki.operands]
            sel = tune(op_name, *tensors, settings=settings, templates=pool, store_tag="inductor",
                       alpha=ki.alpha, beta=ki.beta, progress=False)
            if sel.kernel is not None:
                kernels.append((ki.operands, bound_to(sel.kernel, tensors)))
        from_store.append(bool(sel.cache_hit))
        return sel.winner.key

    picks = refined(bucket_range(symbol, hint, wanted), pick_at)
    family = family_text(kernel_inputs.shapes_symbolic()[-2:], kernel_inputs.strides_symbolic()[-2:],
                         kernel_inputs.dtypes()[-2:], symbol, device)
    text = table_text(op_name, *scalars_of(kernel_inputs), picks, family)
    for operands, kernel in kernels:
        register(text, operands, kernel)
    STATS["tables"] += 1
    return text, sum(from_store)


def answer(handler: Any, kernel_inputs: Any, templates: list, op_name: str, symbol: Any) -> list | None:
    """The handler's choices for a call whose M alone is symbolic: the bucketed extern call, once per
    problem (in the call that offers the library kernel; [] in addmm's later call); None where this call
    cannot build it (no library kernel offered, the tune failed): the handler goes on as for a fixed M."""
    from torch._inductor.kernel_template_choice import KernelTemplateChoice
    from torch._inductor.template_heuristics.params import DictKernelTemplateParams

    from ..core.settings import Settings
    from .compat import inductor_templates

    key = table_key(kernel_inputs, op_name)
    library = next((t for t in templates if t.uid == inductor_templates().aten.get(op_name)), None)
    if library is None:
        return [] if key in handler.tables else None
    text = handler.tables.get(key)
    if text is None:
        try:
            text, from_store = tune_table(kernel_inputs, op_name, symbol, handler.m,
                                          handler.settings or Settings.from_env(), handler.templates)
        except Exception as exc:  # noqa: BLE001 - the fixed-M path is a safe answer
            log.warning("gemmtune.inductor: tuning %s over M buckets failed (%s: %s); tuned at one M", op_name,
                        type(exc).__name__, exc)
            handler.stats["bucket_tune_failed"] += 1
            return None
        handler.tables[key] = text
        handler.stats["bucketed"] += 1
        handler.stats["store_hit"] += from_store
    base = next(iter(handler.get_ktc(kernel_inputs, library, op_name)), None)
    if base is None:
        return None
    return [KernelTemplateChoice(template=buckets_choice(), params=DictKernelTemplateParams({"table": text}),
                                 extra_kwargs={}, layout=base.layout, inputs=kernel_inputs)]
