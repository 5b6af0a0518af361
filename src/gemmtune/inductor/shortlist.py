"""Which of Inductor's own candidates a problem new to the store is timed on.

A problem the store does not know is timed once on Inductor's kernels (`measure="inductor"`).
Inductor offers about 18 Triton configs per template for a GEMM and compiles every one of them
before it times them: on a cold machine those compiles are most of what a first compile pays over a
default one.  Following gemmtune's prescreen, the configs are ranked by gemmtune's analytic cost
model (`search.cost_model`) first, and only the best `top` of each template are compiled and timed.
Library kernels always stay, as do candidates whose options the model cannot read (decompose-K,
a template without block sizes).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..core.inputs import KernelInputs
from ..search.cost_model import estimate_ms, hardware_for

TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")
SHORTLIST = 6


def tile_of(options: Mapping[str, Any]) -> dict[str, int] | None:
    """The block sizes, stages and warps of a template's options; None when one is missing.

    Example:
        >>> tile_of({"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 128, "num_stages": 5, "num_warps": 4, "GROUP_M": 8})
        {'BLOCK_M': 64, 'BLOCK_N': 32, 'BLOCK_K': 128, 'num_stages': 5, 'num_warps': 4}
        >>> tile_of({"k_split": 4}) is None
        True
    """
    tile = {k: options.get(k) for k in TILE_KEYS}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in tile.values()):
        return None
    return tile  # type: ignore[return-value]


def shortlist(candidates: Sequence[tuple[str, Mapping[str, Any] | None]], ki: KernelInputs,
              top: int | None, device_name: str = "") -> list[int]:
    """Indices of the candidates to keep, in their given order: every library kernel and unreadable
    candidate, and the `top` best-modelled tiles of each template.  `candidates` are
    `(template uid, options)` pairs; `top=None` keeps everything.

    Example:
        >>> from gemmtune.core.inputs import KernelInputs, TensorMeta
        >>> import torch
        >>> ki = KernelInputs("mm", (TensorMeta((64, 1024), (1024, 1), torch.bfloat16, "cuda"),
        ...                          TensorMeta((1024, 4096), (4096, 1), torch.bfloat16, "cuda")))
        >>> tiny = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=1, num_warps=2)
        >>> good = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_stages=5, num_warps=4)
        >>> shortlist([("aten::mm", None), ("triton::mm", tiny), ("triton::mm", good)], ki, top=1)
        [0, 2]
    """
    if top is None:
        return list(range(len(candidates)))
    if top < 1:
        raise ValueError(f"shortlist: top must be >= 1 or None, got {top!r}")
    hw = hardware_for(device_name)
    dtype_bytes = ki.a.dtype.itemsize
    ranked: dict[str, list[tuple[float, int]]] = {}
    keep = []
    for i, (uid, options) in enumerate(candidates):
        tile = None if uid.startswith("aten::") or options is None else tile_of(options)
        if tile is None:
            keep.append(i)
            continue
        ms = estimate_ms(tile, ki.M, ki.N, ki.K, dtype_bytes, ki.batch, hw)
        ranked.setdefault(uid, []).append((ms, i))
    for rows in ranked.values():
        keep += [i for _, i in sorted(rows)[:top]]
    return sorted(keep)


def _options_of(ktc: Any) -> Mapping[str, Any] | None:
    try:
        return dict(ktc.params.to_kwargs())
    except Exception:  # noqa: BLE001 - a choice whose options cannot be read is kept, unranked
        return None


def shortlist_choices(ktcs: Sequence[Any], ki: KernelInputs | None, top: int | None, device: Any) -> list[Any]:
    """Inductor's `KernelTemplateChoice`s cut to `shortlist`'s picks (all of them when `ki` is None:
    symbolic sizes).  `device`: the kernel inputs' torch device (its name selects the hardware)."""
    if ki is None or top is None:
        return list(ktcs)
    import torch

    name = torch.cuda.get_device_name(device) if getattr(device, "type", "") == "cuda" else ""
    keep = shortlist([(str(k.template.uid), _options_of(k)) for k in ktcs], ki, top, name)
    return [ktcs[i] for i in keep]
