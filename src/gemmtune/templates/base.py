"""The template plug-in interface.

A template turns a problem into candidate Choices and a Choice into a compiled
launcher.  The engine only talks to this interface; it never asks which kind
of template it holds.
"""

from __future__ import annotations

import hashlib
import inspect
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from ..core.choices import Choice, as_params
from ..core.inputs import KernelInputs

Launcher = Callable[..., torch.Tensor]
"""`launcher(tensors, out, **runtime) -> out`: runs one compiled binary."""


def source_hash(*objs: Any) -> str:
    """sha256 of the sources `objs` in order: a `Path` adds the file's bytes, a string its text, a
    function or class its source text.  Every template's `src_hash` is computed here.

    Example:
        >>> import hashlib
        >>> source_hash("a", "b") == hashlib.sha256(b"ab").hexdigest()
        True
    """
    h = hashlib.sha256()
    for obj in objs:
        if isinstance(obj, Path):
            h.update(obj.read_bytes())
        else:
            h.update((obj if isinstance(obj, str) else inspect.getsource(obj)).encode())
    return h.hexdigest()


NARROW, WIDE = 128, 16384
"""An output this narrow on one side (M or N) and this wide on the other is a narrow problem: the vision
models' convolutions as GEMMs (M of 10^5-10^6, N and K of 16-128) and their transposes."""


def streaming(M: int, N: int, K: int) -> bool:
    """Whether a problem's time is the bytes of its rows: M at least `WIDE`, K at most 256, and either N at
    most `NARROW` or K at most 64 (the vision models' convolutions as GEMMs, tall problems with a tiny K).
    Each tile takes a few K steps over rows of A that are read once: copying A into padded storage costs
    about what the whole GEMM does, and a persistent kernel has little K loop to overlap, so neither padded
    twins nor the persistent TMA template are offered.  An H100 sweep of nine such problems
    (`gemmtune/data/sweep_h100_streaming.jsonl.gz`, docs/ARCHITECTURE.md) found each of those 8-277 %
    slower than the plain Triton kernel.

    Example:
        >>> streaming(401408, 24, 72), streaming(65536, 1024, 16), streaming(4096, 4096, 64)
        (True, True, False)
        >>> streaming(401408, 512, 128), streaming(8, 32001, 4096), streaming(401408, 64, 4096)
        (False, False, False)
    """
    return M >= WIDE and K <= 256 and (N <= NARROW or K <= 64)


def pow2_at_least(x: int) -> int:
    """The smallest power of two >= x, for x >= 1: tiles are clamped to it for small problems.

    Example:
        >>> [pow2_at_least(x) for x in (1, 3, 16, 17)]
        [1, 4, 16, 32]
    """
    return 1 << max(0, (x - 1).bit_length())


def unique_configs(configs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`configs` as dicts with repeats dropped, first occurrence kept: fitting tiles to a small
    problem maps several configs onto one, and each binary should be offered once.

    Example:
        >>> unique_configs([{"BLOCK_M": 16}, {"BLOCK_M": 32}, {"BLOCK_M": 16}])
        [{'BLOCK_M': 16}, {'BLOCK_M': 32}]
    """
    seen, out = set(), []
    for cfg in configs:
        key = tuple(sorted(cfg.items()))
        if key not in seen:
            seen.add(key)
            out.append(dict(cfg))
    return out


class Template(ABC):
    """A family of kernels sharing one source.

    Subclasses set `uid`, `family` and `src_hash` (None for library kernels)
    and implement `supports`, `configs` and `compile`.  `ops` names the ops the
    template offers candidates for: the registry asks `supports` only for those.
    """

    uid: str
    family: str
    src_hash: str | None = None
    ops: tuple[str, ...] = ("mm", "addmm", "bmm")  # a scaled_mm template says ("scaled_mm",)
    runtime_space: Mapping[str, Sequence[Any]] = {}
    config_text_keys: tuple[str, ...] = ()  # config keys whose values are names (strings); the rest are integers
    default_runtime: Mapping[str, Any] = {}  # the stage-1 value for prescreening
    # Device types where the template is active by default; elsewhere (e.g. the
    # Triton interpreter on CPU) only when its family is asked for by name.
    native_devices: tuple[str, ...] = ("cpu", "cuda")
    opt_in: bool = False  # True: pooled only where `backends` names its family (or `templates=` lists it)
    default_min_dim: int = 0  # with `backends` unset: pooled only for problems whose M, N and K are all this or more
    # Whether `trace` can emit this template's kernels into a `torch.compile` graph.
    traceable: bool = False
    any_out_stride: bool = False  # its kernels write an output of any row stride (a padded twin then keeps N)

    @property
    def is_extern(self) -> bool:
        return self.src_hash is None

    @property
    def writes_padded_rows(self) -> bool:
        """Whether its launcher writes an `out` whose rows are padded (`out_layout="padded"`): torch's own op
        (`out=`) does; a generated kernel is built for rows of N elements."""
        return self.is_extern

    def unavailable(self) -> str | None:
        """Why this template cannot run on this machine at all (None: it can).  An optional template
        (`registry.OPTIONAL_TEMPLATES`) joins the pool only where this is None."""
        return None

    @abstractmethod
    def supports(self, ki: KernelInputs) -> bool:
        """Whether this template can run `ki` at all (op, dtype, device)."""

    def compile_configs(self, ki: KernelInputs) -> Sequence[Mapping[str, Any]]:
        """Compile-time configs fitted to `ki`; library kernels have one empty config."""
        return [{}]

    def configs(self, ki: KernelInputs) -> list[Choice]:
        """Every candidate for `ki`: each compile-time config x each runtime value."""
        runtimes = [as_params(rt) for rt in _product(self.runtime_space)]
        return [
            Choice(self.uid, self.src_hash, config, rt, family=self.family)
            for config in map(as_params, self.compile_configs(ki))
            for rt in runtimes
        ]

    @abstractmethod
    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        """Build the binary for `choice` (runtime params excluded) and return its launcher."""

    def on_padded_storage(self) -> "Template":
        """This template as a padded twin runs it: every operand row whole in storage of aligned rows
        (`padded.pad_operands`), so a kernel may read up to the row's alignment past N.  Default: itself."""
        return self

    def prepare_compiles(self, choices: Sequence[Choice], ki: KernelInputs, example: Sequence[torch.Tensor]) -> None:
        """Called once before `compile` runs for each of `choices` (one binary each, in threads): a
        template whose compiler works one at a time in a process may start them elsewhere.  Default:
        nothing."""

    def trace(self, choice: Choice, ki: KernelInputs) -> Launcher:
        """A launcher for `choice` made only of torch ops and `torch.library.wrap_triton` kernels, so a
        `torch.compile` trace records the kernel itself (shapes as in `ki`; nothing compiles here).
        Only templates with `traceable = True` implement it."""
        raise NotImplementedError(f"{self.uid}: its kernels cannot be emitted into a traced graph")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} uid={self.uid} src_hash={(self.src_hash or 'None')[:12]}>"


def tile_order(swizzle: int, grid_m: int) -> int:
    """Which order of output tiles a swizzle gives on `grid_m` rows of tiles (`cdiv(M, BLOCK_M)`): two
    swizzles with the same value launch the same programs on the same tiles (the Triton kernels'
    `swizzled_tile`: a group of `swizzle` rows as tall as the grid or taller is the whole grid).  So
    with one row of tiles every swizzle runs the same kernel, and their timings are repeats.

    Example:
        >>> [tile_order(s, 1) for s in (1, 2, 4, 8)], [tile_order(s, 2) for s in (1, 2, 4, 8)]
        ([1, 1, 1, 1], [1, 2, 2, 2])
    """
    return min(swizzle, max(1, grid_m))


def kernel_key(choice: Choice, m: int | None) -> tuple:
    """What `choice` runs on a problem of `m` rows (per batch): choices with one key run one kernel.  A
    tiled Triton choice (a BLOCK_M and a runtime `swizzle`) is its binary and its `tile_order`; any
    other choice, or `m` unknown (None), is a kernel of its own.

    Example:
        >>> from gemmtune.core.choices import Choice, as_params
        >>> tile = lambda s: Choice("triton_mm", "h", as_params({"BLOCK_M": 16}), as_params({"swizzle": s}),
        ...                         family="triton")
        >>> kernel_key(tile(1), 16) == kernel_key(tile(8), 16), kernel_key(tile(1), 64) == kernel_key(tile(8), 64)
        (True, False)
    """
    swizzle, bm = choice.runtime_dict.get("swizzle"), choice.config_dict.get("BLOCK_M")
    if m is None or choice.family != "triton" or not isinstance(swizzle, int) or not isinstance(bm, int) or bm < 1:
        return (choice.key,)
    return choice.binary_key, tile_order(swizzle, -(-m // bm))


def _product(space: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    combos: list[dict[str, Any]] = [{}]
    for name, values in sorted(space.items()):
        combos = [{**c, name: v} for c in combos for v in values]
    return combos


def split_operands(ki: KernelInputs, tensors: Sequence[torch.Tensor]):
    """(bias or None, a, b) in op order."""
    if ki.op == "addmm":
        return tensors[0], tensors[1], tensors[2]
    return None, tensors[0], tensors[1]


def bias_only(out: torch.Tensor, bias: torch.Tensor | None, beta: float) -> torch.Tensor:
    """`out` set to addmm's result when alpha == 0: `beta * bias`, or zeros where there is no bias
    (beta == 0).  torch.addmm does not compute A @ B then, so NaN and Inf in A or B do not reach the
    output; a kernel that multiplied its product by 0 would turn them into NaN.

    Example:
        >>> bias_only(torch.empty(2, 3), torch.ones(3), 2.0).tolist(), bias_only(torch.empty(1, 2), None, 0.0).tolist()
        ([[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]], [[0.0, 0.0]])
    """
    if bias is None:
        return out.zero_()
    return out.copy_(bias.expand_as(out)).mul_(beta)
