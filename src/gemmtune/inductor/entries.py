"""A gemmtune pick as Inductor lookup-table entries.

| gemmtune pick | Inductor entry | exact |
|---|---|---|
| `aten_mm`, `aten_addmm`, `aten_bmm`, `numpy_blas` | the op's aten kernel (`aten::mm` & co.) | yes (CPU BLAS: no) |
| `aten_bias_addmm` | `aten::bias_addmm`, then `aten::addmm` | yes |
| `triton_mm` | `triton::mm` (`triton::bmm` for bmm): BLOCK_M/N/K, num_stages, num_warps, GROUP_M = swizzle | yes |
| `triton_tma_persistent` | `triton::mm_persistent_tma`, the same tile (EPILOGUE_SUBTILE has no counterpart) | yes |
| `triton_splitk`, `triton_skinny` (SPLIT_K > 1, mm, SPLIT_K divides K) | `decompose_k` with k_split = SPLIT_K, then the best few below | no |
| anything else (`triton_gemv`, one-launch skinny, numba) | the best few measured `triton_mm` configs as `triton::mm`, else the pick's own tile; then aten | no |

Triton entries carry every option of Inductor's mm/bmm template that is not a per-device extra
(the tile, GROUP_M, EVEN_K, ACC_TYPE, USE_FAST_ACCUM), so torch versions whose LookupTableChoices
uses an entry without merging the heuristic's own options still get a complete plain-template entry.
`template_hash` is the installed torch's source hash of the Inductor template, so Inductor drops an
entry when its template changes.

Example:
    >>> import torch
    >>> ki = KernelInputs.from_tensors("mm", torch.randn(8, 4), torch.randn(4, 2))
    >>> entries_for(ki, Choice("aten_mm", None)).entries if available() else ({'template_id': 'aten::mm'},)
    ({'template_id': 'aten::mm'},)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..core.choices import Choice, Timing, as_params
from ..core.errors import InputError
from ..core.inputs import KernelInputs
from .compat import available, inductor_templates  # noqa: F401 - `available` is used by the doctest

__all__ = ["Measured", "InductorPick", "entries_for", "mm_companion", "triton_entry", "entry_options", "fuse_gain_ms",
           "companions_for", "TILE_KEYS", "LIBRARY"]

TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")
LIBRARY = {"aten_mm", "aten_addmm", "aten_bmm", "numpy_blas"}
DEFAULT_GROUP_M = 8
ACC_TYPES = {"torch.float64": "tl.float64"}  # Inductor's accumulator: fp32, fp64 for fp64 inputs


def Measured(template: str, config: Mapping[str, Any], runtime: Mapping[str, Any], ms: float | None) -> Timing:
    """The former timed-candidate class of this module, kept for code written against it: the entries
    now read `gemmtune.Timing`s (a Selection's `timings`, or the store's, `gemmtune.store.rows.to_timing`).

    Example:
        >>> t = Measured("triton_mm", {"BLOCK_M": 64}, {"swizzle": 8}, 0.5)
        >>> t.choice.template_uid, t.choice.config_dict, t.ms
        ('triton_mm', {'BLOCK_M': 64}, 0.5)
    """
    return Timing(Choice(template, None, as_params(dict(config)), as_params(dict(runtime))), ms, "store")


@dataclass(frozen=True)
class InductorPick:
    """What Inductor is told about one problem.

    `entries` (best first) are lookup-table entries for torch's own `LookupTableChoices`; `exact` says
    the first one is the gemmtune pick itself (an installed `gemmtune.inductor` handler then builds only
    it); otherwise they are the few closest choices Inductor can express, and Inductor times those.
    """

    op: str
    keys: tuple[str, ...]
    entries: tuple[Mapping[str, Any], ...]
    exact: bool
    source: str  # the gemmtune pick, e.g. "triton_mm BLOCK_M=128 ... swizzle=8"
    problem: str = ""  # KernelInputs.describe()
    ms: float | None = field(default=None, compare=False)
    inputs: KernelInputs | None = field(default=None, compare=False, repr=False)  # the problem, when known
    # Handed to Inductor beside an exact library pick: the best measured Triton config that Inductor
    # can build, so that it can weigh fusing the GEMM's epilogue (a library kernel fuses nothing).
    companions: tuple[Mapping[str, Any], ...] = ()
    companion_ms: tuple[float, ...] = field(default=(), compare=False)  # each companion's time, unfused

    def json_entries(self) -> list[dict[str, Any]]:
        return [dict(e) for e in (*self.entries, *self.companions)]


def entry_options(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry as its template's keyword arguments (what LookupTableChoices passes on): a copy without
    `template_id` and `template_hash`.

    Example:
        >>> entry_options({"template_id": "triton::mm", "template_hash": "h", "BLOCK_M": 64})
        {'BLOCK_M': 64}
    """
    return {k: copy.deepcopy(v) for k, v in entry.items() if k not in ("template_id", "template_hash")}


def _aten(op: str) -> dict[str, Any]:
    return {"template_id": inductor_templates().aten[op]}


def triton_entry(ki: KernelInputs, uid: str, config: Mapping[str, Any], runtime: Mapping[str, Any]) -> dict[str, Any]:
    """A Triton template entry: the tile, GROUP_M from the swizzle, EVEN_K for this K (the base config's
    EVEN_K belongs to another BLOCK_K, so it must be set here)."""
    tile = {k: int(config[k]) for k in TILE_KEYS}
    entry = {"template_id": uid, "template_hash": inductor_templates().hash_of(uid), **tile,
             "GROUP_M": int(runtime.get("swizzle", DEFAULT_GROUP_M)), "EVEN_K": ki.K % tile["BLOCK_K"] == 0,
             "ACC_TYPE": ACC_TYPES.get(str(ki.dtype), "tl.float32"), "USE_FAST_ACCUM": False}
    return {k: v for k, v in entry.items() if v is not None}


def _nearest_tile(config: Mapping[str, Any]) -> dict[str, Any]:
    """An Inductor mm tile next to a pick without one (GEMV: no BLOCK_M; tiles of at least 16)."""
    return {"BLOCK_M": max(16, int(config.get("BLOCK_M", 16))), "BLOCK_N": max(16, int(config.get("BLOCK_N", 64))),
            "BLOCK_K": max(16, int(config.get("BLOCK_K", 64))), "num_stages": int(config.get("num_stages", 3)),
            "num_warps": int(config.get("num_warps", 4))}


def _closest(ki: KernelInputs, pick: Choice, measured: Sequence[Timing], few: int) -> list[dict[str, Any]]:
    """The best `few` measured plain Triton configs as Inductor mm entries (else the pick's own tile)."""
    uid = inductor_templates().triton_bmm if ki.op == "bmm" else inductor_templates().triton_mm
    timed = sorted((m for m in measured if m.choice.template_uid == "triton_mm" and m.ms is not None),
                   key=lambda m: m.ms or 0.0)
    out: list[dict[str, Any]] = []
    for m in timed:
        e = triton_entry(ki, uid, m.choice.config_dict, m.choice.runtime_dict)
        if e not in out:
            out.append(e)
        if len(out) >= few:
            return out
    if not out and not pick.is_extern:
        out.append(triton_entry(ki, uid, _nearest_tile(pick.config_dict), pick.runtime_dict))
    return out


FUSION: int | str = "predict"  # how a library pick's epilogue fusion is decided by default (docs/MODELS.md)
COMPANIONS = 2  # fusion companions kept with a library pick when the fusion is predicted
FUSION_WITHIN = 1.3  # a fusion companion is at most this much slower than the library pick, unfused
EPILOGUE_LAUNCH_MS = 0.004  # what a separate epilogue kernel costs beyond its memory traffic (a launch)
EPILOGUE_BYTES_PER_MS = 3.0e9  # the memory rate an epilogue kernel moves the GEMM's output at (3 TB/s)


def companions_for(fusion: int | str) -> int:
    """How many fusion companions to keep with a library pick for a `fusion` setting."""
    if fusion == "predict":
        return COMPANIONS
    if isinstance(fusion, bool):  # False: no companions; True: one
        return int(fusion)
    if not isinstance(fusion, int) or fusion < 0:
        raise InputError(f"fusion: expected 'predict' or a count >= 0, got {fusion!r}")
    return fusion


def fuse_gain_ms(pick: "InductorPick") -> float | None:
    """Predicted ms saved by building a library pick's best fusion companion instead, where the GEMM has
    a pointwise epilogue: the separate epilogue kernel it saves (a launch, and writing then reading the
    [M, N] output once more) less how much slower the companion ran unfused.  None: nothing to weigh.

    Example:
        >>> import torch
        >>> from gemmtune.core.inputs import TensorMeta
        >>> meta = lambda size, stride: TensorMeta(size, stride, torch.bfloat16, "cuda:0")
        >>> ki = KernelInputs("mm", (meta((16, 4096), (4096, 1)), meta((4096, 4096), (1, 4096))))
        >>> p = InductorPick("mm", (), ({"template_id": "aten::mm"},), True, "aten_mm", ms=0.010, inputs=ki,
        ...                  companions=({"template_id": "triton::mm"},), companion_ms=(0.012,))
        >>> round(fuse_gain_ms(p), 4)
        0.0021
    """
    if not pick.companion_ms or pick.ms is None or pick.inputs is None:
        return None
    ki = pick.inputs
    out_bytes = ki.M * ki.N * ki.batch * ki.dtype.itemsize
    saved = EPILOGUE_LAUNCH_MS + 2 * out_bytes / EPILOGUE_BYTES_PER_MS
    return saved - (pick.companion_ms[0] - pick.ms)


def _fusion_companions(ki: KernelInputs, pick_ms: float | None, measured: Sequence[Timing],
                       n: int) -> tuple[tuple, tuple]:
    """The `n` best measured `triton_mm` configs as Inductor entries, those within `FUSION_WITHIN` of
    the library pick's time (a GPU problem; else none), and their times."""
    if ki.device_type != "cuda" or pick_ms is None or n < 1:
        return (), ()
    uid = inductor_templates().triton_bmm if ki.op == "bmm" else inductor_templates().triton_mm
    out: list[dict[str, Any]] = []
    ms: list[float] = []
    for m in sorted((m for m in measured if m.choice.template_uid == "triton_mm" and m.ms is not None),
                    key=lambda m: m.ms or 0.0):
        entry = triton_entry(ki, uid, m.choice.config_dict, m.choice.runtime_dict)
        if (m.ms or 0.0) > pick_ms * FUSION_WITHIN or len(out) >= n:
            break
        if entry not in out:
            out.append(entry)
            ms.append(float(m.ms or 0.0))
    return tuple(out), tuple(ms)


def entries_for(ki: KernelInputs, pick: Choice, measured: Iterable[Timing] = (), few: int = 2,
                keys: tuple[str, ...] = (), fusion: int | str = FUSION,
                extern: Iterable[str] = ()) -> InductorPick:
    """The Inductor entries for `pick`, the winner of problem `ki` (`measured`: the other timings).
    `fusion`: beside a library pick, keep its best Triton configs as companions (`InductorPick`):
    `companions_for(fusion)` of them ("predict": two, for the handler to choose from).  A pick of a
    template in `extern` is one exact entry, gemmtune's kernel as an extern call (`inductor.extern`).

    Example:
        >>> import torch
        >>> from gemmtune.core.inputs import TensorMeta
        >>> meta = lambda size, stride: TensorMeta(size, stride, torch.bfloat16, "cuda:0")
        >>> ki = KernelInputs("mm", (meta((64, 32), (32, 1)), meta((32, 16), (16, 1))))
        >>> c = Choice("triton_mm", "h", (("BLOCK_K", 32), ("BLOCK_M", 64), ("BLOCK_N", 16), ("num_stages", 2),
        ...            ("num_warps", 4)), (("swizzle", 4),))
        >>> e = entries_for(ki, c).entries[0] if available() else {"GROUP_M": 4, "EVEN_K": True}
        >>> e["GROUP_M"], e["EVEN_K"]
        (4, True)
    """
    measured, t = list(measured), inductor_templates()
    cfg, rt, uid = pick.config_dict, pick.runtime_dict, pick.template_uid
    on_gpu = ki.device_type == "cuda"
    entries: list[dict[str, Any]]
    if uid in LIBRARY or uid == "aten_bias_addmm" and "bias_addmm" not in t.aten:
        entries, exact = [_aten(ki.op)], uid != "numpy_blas"
    elif uid == "aten_bias_addmm" and "bias_addmm" in t.aten:
        entries, exact = [_aten("bias_addmm"), _aten("addmm")], True
    elif uid in set(extern):
        from .extern import EXTERN_UID, pick_text

        entries, exact = [{"template_id": EXTERN_UID, "pick": pick_text(ki.op, ki.alpha, ki.beta, pick.key)}], True
    elif uid == "triton_mm" and on_gpu:
        entries, exact = [triton_entry(ki, t.triton_bmm if ki.op == "bmm" else t.triton_mm, cfg, rt)], True
    elif uid == "triton_tma_persistent" and on_gpu and ki.op != "bmm" and t.tma is not None:
        entries, exact = [triton_entry(ki, t.tma, cfg, rt)], True
    else:
        split = int(cfg.get("SPLIT_K", 1))
        first = ([{"template_id": t.decompose_k, "k_split": split}]
                 if t.decompose_k and on_gpu and ki.op == "mm" and split > 1 and ki.K % split == 0 else [])
        rest = _closest(ki, pick, measured, few) if on_gpu else []
        entries, exact = [*first, *rest, _aten(ki.op)], False
    source = " ".join([uid, *(f"{k}={v}" for k, v in cfg.items()), *(f"{k}={v}" for k, v in rt.items())])
    ms = min((m.ms for m in measured if m.choice.template_uid == uid and m.choice.config_dict == cfg and m.ms is not None),
             default=None)
    library = exact and all(str(e["template_id"]).startswith("aten::") for e in entries)
    companions, companion_ms = _fusion_companions(ki, ms, measured, companions_for(fusion)) if library else ((), ())
    return InductorPick(ki.op, keys, tuple(entries), exact, source, ki.describe(), ms, ki, companions, companion_ms)


def mm_companion(ki: KernelInputs, pick: InductorPick, keys: tuple[str, ...]) -> InductorPick | None:
    """An addmm pick as the entries of its plain mm (`keys`: the mm's keys), or None for other ops.

    On a GPU Inductor unfuses `addmm` whose users are pointwise into `mm` + a pointwise epilogue
    (fp32; fp16/bf16 stay fused by default), so the mm is asked for: the same tile serves it, and the
    library pick becomes `aten::mm`.  A real mm pick of the same problem wins over this companion.
    """
    if ki.op != "addmm":
        return None
    aten = inductor_templates().aten
    entries: list[dict[str, Any]] = []
    for e in pick.entries:
        uid = e.get("template_id")
        if uid == aten.get("bias_addmm"):
            continue
        new = {"template_id": aten["mm"]} if uid == aten["addmm"] else dict(e)
        if new not in entries:
            entries.append(new)
    return InductorPick("mm", keys, tuple(entries), pick.exact, pick.source + " (as mm)", pick.problem, pick.ms, ki,
                        pick.companions, pick.companion_ms)
