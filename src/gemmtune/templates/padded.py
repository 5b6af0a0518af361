"""Padded candidates: a template's kernel run on operands copied into aligned, zero-padded storage.

A GEMM whose leading dimension is not a multiple of 16 bytes (a bf16 K or N not a multiple of 8,
such as 777x1234x5555 or a vocabulary of 32001) rules out vector loads, TMA and the library's fastest
kernels.  `PaddedTemplate(inner)` offers each of `inner`'s candidates on the padded problem: each call
copies the operands into aligned storage (zeros in the padding, so the product is unchanged), runs
the aligned kernel and copies the output's top-left block out.  Its time, as every candidate's,
is the whole call: the copies count, so padding wins only where the aligned kernel saves more than
they cost.

A padded dimension is one that is some operand's leading dimension: K where A is row-major or B
column-major, N (the output's and a row-major B's), M where A is column-major.  Each is rounded up
to `align_of(dtype)` elements (16 bytes).  A weight that is a parameter (`nn.Parameter`, or a view
of one such as `weight.t()`) is padded once and kept until the parameter changes (its version
counter moves, as an optimizer step moves it), so a patched `nn.Linear` pays only the activation's copy.

A twin of a template whose kernels write any output stride (`any_out_stride`: the Triton templates)
keeps N (`PaddedTemplate.keep_n`): a row-major B gets padded storage seen through its
first N columns (aligned rows, the same product) and the kernel writes the output itself, with no block
copied out; where only the output's N is misaligned it is not offered (it would be the template's own
candidate).

`padded_pool` adds a padded twin of each template of the default pool on a GPU (`registry.
active_templates`), but not on a streaming problem (`templates.base.streaming`: a copy of its operands
costs about what its GEMM does); elsewhere a `PaddedTemplate` competes only where `templates=` lists it.

Example:
    >>> import torch
    >>> from gemmtune.templates.extern import AtenTemplate
    >>> ki = KernelInputs.from_tensors("mm", torch.randn(5, 7), torch.randn(7, 9))
    >>> padding_dims(ki), padded_problem(ki).describe()
    ({'N': 12, 'K': 8}, 'mm(5x8, 8x12)')
    >>> PaddedTemplate(AtenTemplate("mm")).uid
    'padded_aten_mm'
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..core.choices import Choice
from ..core.inputs import KernelInputs, TensorMeta
from ..core.layout import ALIGN_BYTES, padded_row
from .base import Launcher, Template, source_hash, streaming
from .staging import padded_copy, staged_padder

PREFIX = "padded_"
"""A padded template's uid is this prefix and its inner template's uid."""

OPS = ("mm", "addmm", "bmm", "scaled_mm")
_SOURCE = Path(__file__)


def align_of(dtype: torch.dtype) -> int:
    """Elements in `ALIGN_BYTES` (16): 8 for bf16/fp16, 4 for fp32, 16 for fp8.

    Example:
        >>> align_of(torch.bfloat16), align_of(torch.float32), align_of(torch.float8_e4m3fn)
        (8, 4, 16)
    """
    return max(1, ALIGN_BYTES // dtype.itemsize)


def _row_major(meta: TensorMeta) -> bool:
    return meta.stride[-1] == 1 or meta.stride[-2] != 1


def padding_dims(ki: KernelInputs) -> dict[str, int]:
    """The dimensions of `ki` to pad, with their padded sizes (`core.layout.padded_row`; {} where nothing is
    misaligned or the op has no padded form).

    Example:
        >>> a, b = torch.randn(777, 1234, dtype=torch.bfloat16), torch.randn(1234, 5555, dtype=torch.bfloat16)
        >>> padding_dims(KernelInputs.from_tensors("mm", a, b))
        {'N': 5568, 'K': 1280}
        >>> padding_dims(KernelInputs.from_tensors("mm", a, b[:, :5552]))
        {'K': 1280}
    """
    if ki.op not in OPS or min(ki.M, ki.N, ki.K) == 0:
        return {}
    step = align_of(ki.dtype)
    a_row, b_row = _row_major(ki.a), _row_major(ki.b)
    leading = {"M": not a_row, "N": True, "K": a_row or not b_row}
    sizes = {"M": ki.M, "N": ki.N, "K": ki.K}
    return {d: padded_row(n, ki.dtype.itemsize) for d, n in sizes.items() if leading[d] and n % step}


def matrix_padder(size: Sequence[int], row_major: bool, rows: int, cols: int, dtype: torch.dtype) -> Any:
    """`pad(t)`: a matrix of `size` (in that orientation) zero-padded to (rows, cols), staying row- or
    column-major: one `constant_pad_nd`, the widths worked out here once.  None where nothing grows.

    Example:
        >>> pad = matrix_padder((2, 3), False, 2, 4, torch.float32)
        >>> p = pad(torch.ones(3, 2).t())
        >>> p.tolist(), p.stride()
        ([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]], (1, 2))
    """
    r, c = size
    if (r, c) == (rows, cols):
        return None
    widths = [0, cols - c, 0, rows - r] if row_major else [0, rows - r, 0, cols - c]
    pad_nd, byte = torch.constant_pad_nd, dtype.itemsize == 1 and dtype.is_floating_point
    if row_major:
        if byte:  # fp8: pad its bytes (0x00 is +0.0)
            return lambda t: pad_nd(t.view(torch.uint8), widths).view(dtype)
        return lambda t: pad_nd(t, widths)
    if byte:
        return lambda t: pad_nd(t.mT.view(torch.uint8), widths).view(dtype).mT
    return lambda t: pad_nd(t.mT, widths).mT


def pad_matrix(t: Any, rows: int, cols: int) -> Any:
    """`t` with its last two dimensions zero-padded to (rows, cols), in `t`'s own orientation
    (`matrix_padder`); `t` itself where nothing grows.

    Example:
        >>> pad_matrix(torch.ones(2, 3), 2, 4).tolist()
        [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]]
    """
    row_major = t.stride(-1) == 1 or t.stride(-2) != 1
    pad = matrix_padder((t.shape[-2], t.shape[-1]), row_major, rows, cols, t.dtype)
    return t if pad is None else pad(t)


def _pad_vector_like(t: Any, full: Sequence[int], padded: Sequence[int]) -> Any:
    """A bias or scale broadcast against an output of size `full`, padded where it spans a padded dim."""
    if t.dim() == 0:
        return t
    lead = [0] * (t.dim() * 2)
    for i in range(1, t.dim() + 1):  # from the last dimension, as F.pad counts
        n, want, have = t.shape[-i], padded[-i] if i <= len(padded) else None, full[-i] if i <= len(full) else None
        if want is not None and n == have and n != want and n != 1:
            lead[2 * (i - 1) + 1] = want - n
    if not any(lead):
        return t
    return F.pad(t.view(torch.uint8), lead).view(t.dtype) if t.dtype.itemsize == 1 else F.pad(t, lead)


def _b_columns(ki: KernelInputs, dims: dict[str, int], keep_n: bool) -> int:
    """The columns of B's padded storage: N padded (`dims`), or with `keep_n` the problem's N where B is
    column-major (N leads no row of it)."""
    return ki.N if keep_n and not _row_major(ki.b) else dims.get("N", ki.N)


def pad_operands(ki: KernelInputs, tensors: Sequence[Any], dims: dict[str, int], matrix: Any = pad_matrix,
                 keep_n: bool = False) -> tuple:
    """`tensors` (in `ki.op`'s order) padded to `dims` (`padding_dims`); `matrix(t, rows, cols)` pads
    the two matrices (`pad_matrix`).  `keep_n`: N stays the problem's (B's storage padded where it is
    row-major, `PaddedTemplate.keep_n`)."""
    M, K, N = dims.get("M", ki.M), dims.get("K", ki.K), _b_columns(ki, dims, keep_n)
    full, padded = (ki.M, ki.N), (M, ki.N if keep_n else N)
    cut = (lambda t: t[..., :ki.N]) if keep_n and N != ki.N else (lambda t: t)
    if ki.op == "addmm":
        return (_pad_vector_like(tensors[0], full, padded), matrix(tensors[1], M, K), cut(matrix(tensors[2], K, N)))
    out = [matrix(tensors[0], M, K), cut(matrix(tensors[1], K, N))]
    if ki.op == "scaled_mm":
        out += [_pad_vector_like(t, full, padded) for t in tensors[2:4]]
        out += [_pad_vector_like(t, (ki.N,), padded[1:]) for t in tensors[4:]]
    return tuple(out)


def padded_problem(ki: KernelInputs, dims: dict[str, int] | None = None, keep_n: bool = False) -> KernelInputs:
    """`ki` as its padded operands describe it (`padding_dims(ki)` unless `dims` is given; `keep_n`:
    N kept, as `pad_operands` keeps it)."""
    dims = padding_dims(ki) if dims is None else dims
    metas = [torch.empty_strided(m.size, m.stride, dtype=m.dtype, device="meta") for m in ki.operands]
    padded = pad_operands(ki, metas, dims, keep_n=keep_n)
    return KernelInputs(ki.op, tuple(TensorMeta(tuple(t.shape), tuple(t.stride()), t.dtype, m.device)
                                     for t, m in zip(padded, ki.operands)), ki.alpha, ki.beta, ki.out_dtype,
                        ki.fast_accum)


class _ParameterPads:
    """`pads` = (pad anew, pad into kept storage, a padded copy to keep) of the weight operand
    (`_padders`): a parameter's (or a view of one's) copy is kept while the parameter has not changed;
    any other operand goes into kept storage (`staging`), or with `keep` False (a call autograd records,
    which may save it) is padded anew, as is a parameter that needs gradients there (its padded copy
    must carry the call's graph) and any operand while a CUDA graph is captured."""

    def __init__(self, pads: tuple[Any, Any, Any]) -> None:
        self.pad, self.other, self.copy = pads
        self._kept: dict[tuple, tuple[Any, int, Any]] = {}

    def __call__(self, t: Any, keep: bool = True) -> Any:
        base = t if isinstance(t, torch.nn.Parameter) else t._base
        if not isinstance(base, torch.nn.Parameter):  # not a weight (an activation); `other` checks capture
            return self.other(t) if keep else self.pad(t)
        if t.requires_grad and torch.is_grad_enabled() or t.is_cuda and torch.cuda.is_current_stream_capturing():
            return self.pad(t)
        key = (id(base), t.data_ptr(), t.shape, t.stride())
        kept = self._kept.get(key)
        if kept is not None and kept[0]() is base and kept[1] == base._version:
            return kept[2]
        padded = self.copy(t)
        self._kept = {k: v for k, v in self._kept.items() if v[0]() is not None}  # forget freed parameters
        self._kept[key] = (weakref.ref(base), base._version, padded)
        return padded


class PaddedTemplate(Template):
    """`inner`'s candidates on the padded problem (module docstring): the same configs and runtime
    params; the uid `padded_<inner uid>`, the family `inner`'s (a `backends` naming it pools both).

    Example:
        >>> from gemmtune.templates.extern import AtenTemplate
        >>> t = PaddedTemplate(AtenTemplate("mm"))
        >>> t.family, t.is_extern, t.supports(KernelInputs.from_tensors("mm", torch.ones(8, 8), torch.ones(8, 8)))
        ('extern', False, False)
    """

    native_devices = ("cuda",)
    ops = OPS

    def __init__(self, inner: Template):
        self.keep_n = inner.any_out_stride  # its kernels write any output stride: N is never padded
        self.inner = inner.on_padded_storage() if self.keep_n else inner
        self.uid = PREFIX + inner.uid
        self.family = inner.family
        self.src_hash = source_hash(inner.src_hash or inner.uid, _SOURCE)
        self.runtime_space = inner.runtime_space
        self.config_text_keys = inner.config_text_keys
        self.default_runtime = inner.default_runtime
        self.opt_in, self.default_min_dim = inner.opt_in, inner.default_min_dim

    @property
    def writes_padded_rows(self) -> bool:
        """Where its inner template does: it copies its block into `out`, or runs the inner kernel into it."""
        return self.inner.writes_padded_rows

    def _keep_n(self, ki: KernelInputs, dims: dict[str, int]) -> bool:
        return self.keep_n and "M" not in dims

    def supports(self, ki: KernelInputs) -> bool:
        dims = padding_dims(ki)
        if not dims or ki.op not in self.inner.ops:
            return False
        keep = self._keep_n(ki, dims)
        if keep and set(dims) == {"N"} and not _row_major(ki.b):
            return False  # only the output's N is misaligned: the inner template's own candidate is this one
        return self.inner.supports(padded_problem(ki, dims, keep))

    def compile_configs(self, ki: KernelInputs) -> Sequence[dict[str, Any]]:
        dims = padding_dims(ki)
        return [dict(c) for c in self.inner.compile_configs(padded_problem(ki, dims, self._keep_n(ki, dims)))]

    def _inner_choice(self, choice: Choice) -> Choice:
        return Choice(self.inner.uid, self.inner.src_hash, choice.config, choice.runtime, family=self.inner.family)

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        dims = padding_dims(ki)
        keep = self._keep_n(ki, dims)
        inner_ki = padded_problem(ki, dims, keep)
        inner = self.inner.compile(self._inner_choice(choice), inner_ki, pad_operands(ki, example, dims, keep_n=keep))
        return padded_launcher(ki, dims, inner, keep)


def _padders(meta: TensorMeta, rows: int, cols: int, slot: str) -> tuple[Any, Any, Any]:
    """(pad anew, pad into kept storage, copy) of the matrix `meta` to (rows, cols) (`matrix_padder`,
    `staging.staged_padder` for operand `slot`, a new copy to keep: `staging.padded_copy`); each the
    identity where nothing grows."""
    row_major = _row_major(meta)
    plain = matrix_padder(meta.size[-2:], row_major, rows, cols, meta.dtype)
    if plain is None:
        return (lambda t: t), (lambda t: t), (lambda t: t)
    return plain, staged_padder(row_major, rows, cols, plain, slot), lambda t: padded_copy(t, rows, cols, row_major)


def padded_launcher(ki: KernelInputs, dims: dict[str, int], inner: Launcher, keep_n: bool = False) -> Launcher:
    """`launch(tensors, out=None, **runtime)`: `tensors` padded to `dims`, `inner` run on them, the
    result's top-left `ki.out_size` block written to `out` (a new row-major output where None).  The
    padding of each matrix is worked out here once (`matrix_padder`); the weight's is kept while it is
    an unchanged parameter, and any other matrix is copied into zero-padded storage kept for the next
    call (`staging`).  `keep_n`: N kept (`pad_operands`), `inner` writes the output itself.  Where N alone
    of the output is padded, `launch.padded_rows(tensors)` returns the padded output's block, a tensor of its
    own on that storage whose rows are those of `out_layout="padded"` (`core.binding.layout_kernel`): nothing
    is copied."""
    M, K, N = dims.get("M", ki.M), dims.get("K", ki.K), _b_columns(ki, dims, keep_n)
    ia, ib = (1, 2) if ki.op == "addmm" else (0, 1)
    pad_a, pad_b = _padders(ki.a, M, K, "a"), _padders(ki.b, K, N, "b")
    n = ki.N
    cut = (lambda pad: lambda t: pad(t)[..., :n]) if keep_n and N != n else (lambda pad: pad)
    weight = _ParameterPads((cut(pad_b[0]), cut(pad_b[1]), cut(pad_b[2])))
    others = [i for i in range(len(ki.operands)) if i not in (ia, ib)]
    full, padded = ((ki.M, ki.N), (M, ki.N if keep_n else N))
    into_out = "M" not in dims and (keep_n or "N" not in dims)  # the aligned kernel writes `out` itself
    m = ki.M

    def padded_args(tensors, keep=None):
        if keep is None:  # autograd may save any operand of a recorded call: none is kept storage then
            keep = not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        args = list(tensors)
        args[ia], args[ib] = pad_a[1 if keep else 0](tensors[ia]), weight(tensors[ib], keep)
        for i in others:  # addmm's bias, scaled_mm's scales and bias
            args[i] = _pad_vector_like(tensors[i], (ki.N,) if i == 4 else full, padded[1:] if i == 4 else padded)
        return args

    def launch(tensors, out=None, **runtime):
        if into_out:
            return inner(padded_args(tensors), out, **runtime)
        block = inner(padded_args(tensors), None, **runtime)[..., :m, :n]
        return block.contiguous() if out is None else out.copy_(block)

    if hasattr(inner, "bound"):  # the eager dispatch binds it (core/binding.py)
        setattr(launch, "bound",
                lambda tensors, **runtime: _bound(inner, padded_args, tensors, runtime, into_out, m, n))
    if "M" not in dims and dims.get("N") == padded_row(n, ki.result_dtype.itemsize) and not keep_n:
        setattr(launch, "padded_rows",
                lambda tensors, **runtime: _rows(inner(padded_args(tensors), None, **runtime), m, n))
    return launch


def _rows(full: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """`full`'s top-left [m, n] block as a tensor of its own (not a view: an autograd function's output
    may then be changed in place), sharing `full`'s storage: rows of `out_layout="padded"`."""
    block = full[..., :m, :n]
    return full.new_empty(0).set_(full.untyped_storage(), block.storage_offset(), block.shape, block.stride())


def _bound(inner: Any, padded_args: Any, tensors: Sequence[Any], runtime: dict, into_out: bool, m: int,
           n: int) -> Launcher | None:
    """The padded launch bound to one problem: `inner`'s binding (`inner.bound`, e.g.
    `templates.triton.base.bound_launcher`) to the padded operands of `tensors`, run per call on that
    call's padded operands, `fn(*operands, out=None)`.  None where `inner` declines."""
    run = inner.bound(padded_args(tensors, keep=False), **runtime)
    if run is None:
        return None
    if into_out:
        return lambda *operands, out=None: run(*padded_args(operands), out=out)

    def bound(*operands: Any, out: Any = None) -> Any:
        block = run(*padded_args(operands))[..., :m, :n]
        return block.contiguous() if out is None else out.copy_(block)

    return bound


def padded_pool(ki: KernelInputs, pool: Sequence[Template], wanted: Any) -> list[Template]:
    """A padded twin of each template of `pool` that `wanted` (the registry's family filter) keeps and
    that runs the padded problem; [] where `ki` needs no padding.

    Example:
        >>> from gemmtune.templates.extern import AtenTemplate
        >>> ki = KernelInputs.from_tensors("mm", torch.randn(4, 7), torch.randn(7, 4))
        >>> [t.uid for t in padded_pool(ki, [AtenTemplate("mm"), AtenTemplate("bmm")], lambda t: True)]
        ['padded_aten_mm']
    """
    if not padding_dims(ki) or streaming(ki.M, ki.N, ki.K):  # a streaming problem: the copy costs the GEMM
        return []
    twins = (PaddedTemplate(t) for t in pool if ki.op in t.ops and not isinstance(t, PaddedTemplate) and wanted(t))
    return [twin for twin in twins if twin.supports(ki)]  # not a twin that would run the template's own problem
