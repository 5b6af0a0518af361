"""What `gemmtune.patch` routes through gemmtune in a module, what it does not, and why.

The attributes a patched or released layer carries are named here, so that the report reads them
without importing the patching itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

__all__ = ["PatchReport", "patch_report"]

ROUTE = "_gemmtune_route"  # on a patched layer: its route, (backends, out_layout)
RELEASED = "_gemmtune_released"  # on a layer given back to torch's op (`patching.release`): its former route


@dataclass
class PatchReport:
    """What `patch` routes through gemmtune in a module, and what it cannot, with the reason.

    `routed`: names of patched `nn.Linear` layers; `not_routed`: layer name -> why not (MHA's
    projections, subclasses with their own forward, lazy layers); `fast_paths`: module name -> a
    torch fast path that, when taken, skips the patched layers (no gemmtune call at all).
    """

    routed: list[str] = field(default_factory=list)
    not_routed: dict[str, str] = field(default_factory=dict)
    fast_paths: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"gemmtune.patch: {len(self.routed)} layers routed through gemmtune"
                 + (f": {', '.join(self.routed)}" if self.routed else "")]
        lines += [f"  not routed: {name or '<root>'}: {why}" for name, why in self.not_routed.items()]
        lines += [f"  fast path: {name or '<root>'}: {why}" for name, why in self.fast_paths.items()]
        return "\n".join(lines)


_MHA_WHY = "inside nn.MultiheadAttention, which calls F.linear on its weights (never reaches gemmtune)"
_FAST_WHY = ("torch's fused fast path (eval mode, no grad or inference_mode, batch_first, ...; "
             "see torch's why_not_sparsity_fast_path) runs the whole layer in one op: no gemmtune call then")


def patch_report(module: nn.Module) -> PatchReport:
    """What `patch(module)` routes through gemmtune, and what it does not and why.

    Example:
        >>> import torch, gemmtune
        >>> layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        >>> rep = patch_report(gemmtune.patch(layer))
        >>> rep.routed, sorted(rep.not_routed)
        (['linear1', 'linear2'], ['self_attn.out_proj'])
        >>> _ = gemmtune.unpatch(layer)
    """
    rep = PatchReport()
    inside_mha = {id(c) for m in module.modules() if isinstance(m, nn.MultiheadAttention) for c in m.modules()}
    for name, m in module.named_modules():
        if isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerEncoder)):
            rep.fast_paths[name] = _FAST_WHY
        if isinstance(m, nn.MultiheadAttention):
            rep.fast_paths.setdefault(name, "computes its projections with F.linear / a fused kernel")
        if not isinstance(m, nn.Linear):
            continue
        if ROUTE in vars(m):
            rep.routed.append(name)
        elif vars(m).get(RELEASED):
            rep.not_routed[name] = "released by gemmtune.warmup: every problem it met runs torch's op"
        elif id(m) in inside_mha:
            rep.not_routed[name] = _MHA_WHY
        elif type(m).forward is not nn.Linear.forward:
            rep.not_routed[name] = f"{type(m).__name__} has its own forward"
        elif isinstance(m.weight, nn.parameter.UninitializedParameter):
            rep.not_routed[name] = "lazy layer not yet materialised"
        else:
            rep.not_routed[name] = "not patched (call gemmtune.patch on it)"
    return rep
