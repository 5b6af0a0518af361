"""The `cutlass_operators` template: NVIDIA's maintained CuTe DSL GEMMs from nvidia-cutlass-operators.

Compile-time configs are the operators `cutlass.operators.get_operators(GemmArguments(...))` returns for
the problem on this GPU: on Hopper (0.3.0) 24 `Sm90StaticPersistentGemmOperator` designs (tile M 64/128
x N 64/128/256 x K 64, clusters 1x1, 1x2, 2x1, 2x2; stages chosen by the operator) and 4
`Sm80TensorOpGemmOperator` designs.  There are **no runtime params**: `Operator.run(args, artifact,
stream, workspace)` takes nothing per call but the operands (the library's `PerformanceControls` has no
fields, and its Hopper design metadata refuses any), and the tile order (swizzle 1, along M) and the
max-active-clusters bound are fixed when the kernel is traced.  So every choice is its own binary and
the prescreen ranks across compile-time configs (docs/CUTLASS.md).

addmm: where the library offers operators that fuse the bias (`EpilogueArguments`; 0.3.0 has them for
SM100 only) they are the configs (`epilogue="fused"`); on Hopper the bias is added after the GEMM
(`epilogue="separate"`: one more pass over the output).

Each choice's `src_hash` covers this template's source, the library's and the DSL's versions, and the
operator's identity (module, class, design).  Compiled kernels are kept on disk (`operators_lib.compiled`);
a tune about to compile many hands them to compile processes first (`prepare_compiles`, `parallel`).
In the default GPU pool for problems of 2048 or more in every dimension (`default_min_dim`), and at any
size where a `backends` names "cutlass" (`registry.optional_templates`); without the library or a Hopper
GPU it is skipped with one log line.  At those sizes the `"default"` space is a shortlist (`SHORTLIST`):
the Sm90 designs of tile 128x256 and 128x128, the tiles of every best operator measured on the H200
(docs/CUTLASS.md), so a layout's first tune compiles 8 operators, not 28; `size="max"`
(`Settings.config_space`) keeps every operator.

Example:
    >>> CutlassOperatorsTemplate.uid, dict(CutlassOperatorsTemplate.runtime_space)
    ('cutlass_operators', {})
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import types
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ...core.choices import Choice, as_params
from ...core.inputs import KernelInputs
from ..base import Launcher, Template, source_hash, unique_configs
from .dsl import DSL_DISTRIBUTION, dsl_version, ensure_cache_dir, hopper_gpu_reason, installed_version

log = logging.getLogger("gemmtune.templates.cutlass")

LIBRARY_DISTRIBUTION = "nvidia-cutlass-operators"
SOURCES = (Path(__file__), Path(__file__).with_name("operators_lib.py"), Path(__file__).with_name("launch.py"))
DTYPES = (torch.float16, torch.bfloat16)
OPS = ("mm", "addmm", "bmm")


def library_version() -> str | None:
    """The installed nvidia-cutlass-operators version, or None.

    Example:
        >>> v = library_version(); v is None or v[0].isdigit()
        True
    """
    return installed_version(LIBRARY_DISTRIBUTION)


def template_src_hash(library: str | None = None, dsl: str | None = None) -> str:
    """The template's part of every `src_hash`: its source and the library's and DSL's versions.

    Example:
        >>> template_src_hash("0.3.0", "4.8.1") != template_src_hash("0.3.1", "4.8.1")
        True
    """
    return source_hash(*SOURCES, f"{LIBRARY_DISTRIBUTION}=={library or library_version()}",
                       f"{DSL_DISTRIBUTION}=={dsl or dsl_version()}")


def choice_src_hash(base: str, identity: str) -> str:
    """One choice's `src_hash`: the template's (`template_src_hash`) and the operator's identity.

    Example:
        >>> choice_src_hash("h", "m.Op:design(1)") != choice_src_hash("h", "m.Op:design(2)")
        True
    """
    return source_hash(base, identity)


def target_sm(capability: tuple[int, int]) -> str:
    """The library's target for a compute capability: arch-conditional ("90a") from Hopper on.

    Example:
        >>> target_sm((9, 0)), target_sm((10, 0))
        ('90a', '100a')
    """
    return f"{capability[0]}{capability[1]}a"


def library_importable() -> bool:
    """Whether `import cutlass.operators` would find the library and the DSL (nothing imported)."""
    try:
        return (importlib.util.find_spec("cutlass") is not None and dsl_version() is not None
                and library_version() is not None)
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why the template is skipped here (None: usable); logged once, at INFO.

    Example:
        >>> unavailable_reason() is None or isinstance(unavailable_reason(), str)
        True
    """
    if not library_importable():
        reason: str | None = f"{LIBRARY_DISTRIBUTION} is not installed (pip install 'gemmtune[cutlass]')"
    else:
        reason = hopper_gpu_reason()  # "no CUDA device", "compute capability 8.0 < 9.0"
    if reason is not None:
        log.info("cutlass_operators template skipped: %s", reason)
    return reason


SHORTLIST = {"operators": ("Sm90StaticPersistentGemmOperator",), "tiles": ((128, 256), (128, 128))}


def shortlisted(ops: Sequence[Any]) -> list[Any]:
    """The operators of `SHORTLIST` (class and tile M x N) among `ops`, in their order; all of `ops` where
    none is.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> class Sm90StaticPersistentGemmOperator:
        ...     def __init__(self, tile): self.metadata = NS(design=NS(tile_shape=(*tile, 64)))
        >>> ops = [Sm90StaticPersistentGemmOperator(t) for t in ((64, 64), (128, 256), (128, 128))]
        >>> [op.metadata.design.tile_shape[:2] for op in shortlisted(ops)]
        [(128, 256), (128, 128)]
    """
    kept = [op for op in ops if type(op).__name__ in SHORTLIST["operators"]
            and tuple(op.metadata.design.tile_shape[:2]) in SHORTLIST["tiles"]]
    return kept or list(ops)


class CutlassOperatorsTemplate(Template):
    """NVIDIA's nvidia-cutlass-operators GEMMs (mm, addmm, bmm; fp16/bf16) as one template family.

    `library` (the `cutlass.operators` module, imported on first use) and `target` (e.g. "90a"; default:
    this GPU's) are for tests; `operators` keeps only the named operator classes; `direct` (the default)
    calls each compiled kernel with the tensors themselves where the library's run would, once its
    first call agrees with the run bit for bit (`launch.launcher`: 16-21 us of host time per call on
    the H200 against the run's 415-428 us; docs/CUTLASS.md); `direct=False` always calls the run.

    Example:
        >>> t = CutlassOperatorsTemplate()
        >>> t.family, t.native_devices, t.available() == (unavailable_reason() is None)
        ('cutlass', ('cuda',), True)
    """

    uid = "cutlass_operators"
    family = "cutlass"
    src_hash = template_src_hash()
    # In the default GPU pool for large problems only (docs/CUTLASS.md, "In the default pool": it won
    # 4097x4096x4096 by 2 % and 8192^3 by 0.4 % on the H200, where each layout's first tune compiles its
    # operators); any size where a `backends` names "cutlass".
    native_devices: tuple[str, ...] = ("cuda",)
    default_min_dim = 2048
    runtime_space: Mapping[str, Sequence[Any]] = {}  # the library takes no per-call parameter (module doc)
    config_text_keys = ("operator", "epilogue")  # the operator's class name; "none", "fused" or "separate"

    def __init__(self, size: str = "default", operators: Sequence[str] | None = None, library: Any = None,
                 target: str | None = None, direct: bool = True):
        self.size = size  # "default": the shortlist for large problems (module docstring); "max": every operator
        self.keep = tuple(operators) if operators is not None else None
        self.direct = direct  # call the compiled kernel itself once its first call agrees (launch.launcher)
        self._library = library
        self._target = target
        self._found: dict[tuple, tuple[list[Any], str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """What an isolated worker gets: the library by its module name (a module does not pickle), and
        no operators found yet (the worker finds its own)."""
        state = dict(self.__dict__, _found={})
        if isinstance(self._library, types.ModuleType):
            state["_library"] = self._library.__name__
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state.get("_library"), str):
            state = dict(state, _library=importlib.import_module(state["_library"]))
        self.__dict__.update(state)

    @property
    def library(self) -> Any:
        """The library module (`cutlass.operators`, or the fake a test gave)."""
        if self._library is None:
            from . import operators_lib

            self._library = operators_lib.load()
        return self._library

    def target(self) -> str:
        """The library's target for this GPU ("90a" on Hopper), or the one given."""
        return self._target or target_sm(torch.cuda.get_device_capability())

    def available(self) -> bool:
        return self._library is not None or unavailable_reason() is None

    def unavailable(self) -> str | None:
        return None if self.available() else unavailable_reason()

    def supports(self, ki: KernelInputs) -> bool:
        if not (ki.device_type == "cuda" and ki.op in OPS and ki.dtype in DTYPES and self.available()):
            return False
        return bool(self.operators(ki)[0])

    def operators(self, ki: KernelInputs) -> tuple[list[Any], str]:
        """The library's operators for `ki` (those `keep` names) and their epilogue, found once per layout."""
        from . import operators_lib

        key = (ki.op, ki.dtype, ki.a.size, ki.a.stride, ki.b.size, ki.b.stride,
               ki.bias.stride if ki.bias is not None else None, ki.beta != 0.0, self.target())
        if key not in self._found:
            found, epilogue = operators_lib.operators(self.library, ki, self.target())
            kept = [op for op in found if self.keep is None or type(op).__name__ in self.keep]
            if self.size == "default" and min(ki.M, ki.N, ki.K) >= self.default_min_dim:
                kept = shortlisted(kept)
            self._found[key] = (kept, epilogue)
        return self._found[key]

    def compile_configs(self, ki: KernelInputs) -> list[dict[str, Any]]:
        from . import operators_lib

        found, epilogue = self.operators(ki)
        return unique_configs(operators_lib.config_of(op, epilogue) for op in found)

    def configs(self, ki: KernelInputs) -> list[Choice]:
        """One choice per operator, each with its own `src_hash` (`choice_src_hash`)."""
        from . import operators_lib

        found, epilogue = self.operators(ki)
        base = self.src_hash or ""
        choices, seen = [], set()
        for op in found:
            cfg = as_params(operators_lib.config_of(op, epilogue))
            if cfg not in seen:
                seen.add(cfg)
                choices.append(Choice(self.uid, choice_src_hash(base, operators_lib.identity(op)), cfg, as_params({}),
                                      family=self.family))
        return choices

    def _operator(self, ki: KernelInputs, cfg: Mapping[str, Any]) -> Any:
        from . import operators_lib

        for op in self.operators(ki)[0]:
            if operators_lib.matches(op, cfg):
                return op
        raise ValueError(f"cutlass_operators: no operator of the library matches {dict(cfg)} for {ki.describe()}")

    def prepare_compiles(self, choices: Sequence[Choice], ki: KernelInputs, example: Sequence[torch.Tensor]) -> None:
        """Hand the kernels of `choices` not yet on disk to compile processes (`parallel`), when there are
        enough of them to pay for the processes' start; `compile` then waits for each and loads it."""
        ensure_cache_dir()
        from . import launch, operators_lib, parallel

        if not operators_lib.keeps_on_disk(self.library):
            return
        target = self.target()
        jobs = [job for c in choices
                if (job := operators_lib.job_for(c.config_dict, ki, example, operators_lib.kernel_path(
                    launch.disk_key(c.config_dict, ki, target), c.src_hash or "", target), target)) is not None]
        device = example[-1].device
        if jobs:
            parallel.start(jobs, env={"CUTE_DSL_ARCH": f"sm_{target}"}, label=self.uid,
                           cuda_index=(device.index or 0) if device.type == "cuda" else None)

    def compile(self, choice: Choice, ki: KernelInputs, example: Sequence[torch.Tensor]) -> Launcher:
        """Compile (or load from disk, or wait for a compile process's) the operator of `choice` for
        `ki`'s layouts."""
        ensure_cache_dir()
        from . import disk, launch

        cfg = choice.config_dict
        op = self._operator(ki, cfg)
        disk.bind_context(example[-1].device)  # a compile thread has no CUDA context of its own
        return launch.launcher(self.library, op, cfg, ki, example, choice.src_hash or "", self.target(),
                               direct=self.direct)



__all__ = ["CutlassOperatorsTemplate"]
