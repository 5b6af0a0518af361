"""The `gemmtune` command's argument helpers that need no console (and no torch): errors that name flags,
`--store`'s directory check, negative values joined to their flag, and the checks of a problem's flags
that run before torch is imported."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..core.dtype_names import canonical
from ..core.errors import InputError
from ..core.m_range import parse_m
from .dims import check_dims, parse_shape

__all__ = ["FLAGS", "check_device_spelling", "check_problem_args", "check_store_arg", "flag_named",
           "join_negative_values"]


FLAGS = {"top_x": "--top-x", "budget_s": "--budget-s", "report_rows": "--rows", "backends": "--backends",
         "strategy": "--strategy", "effort": "--effort", "isolation": "--isolation", "store": "--store",
         "lookup_table": "--lookup-table", "dtype": "--dtype", "gpus": "--gpus",
         "scales": "--scales", "b_layout": "--b-layout"}
"""Settings fields (and the dtype check) by the `gemmtune` flag that sets them: errors name the flag."""


def flag_named(message: str) -> str:
    """An error about a field set by a flag, naming the flag instead.

    Example:
        >>> flag_named("top_x: must be >= 1, got 0"), flag_named("GEMMTUNE_TOP_X (top_x): must be >= 1")
        ('argument --top-x: must be >= 1, got 0', 'GEMMTUNE_TOP_X (top_x): must be >= 1')
    """
    field, sep, rest = message.partition(": ")
    return f"argument {FLAGS[field]}: {rest}" if sep and field in FLAGS else message


def check_store_arg(store: str | None) -> None:
    """`--store PATH`: its directory must exist (a typo must not create a tree of directories).

    Example:
        >>> check_store_arg("memory"), check_store_arg(None)
        (None, None)
        >>> check_store_arg("/nonexistent/dir/x.sqlite")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: argument --store: directory /nonexistent/dir does not exist (create it first, or use --store memory)
    """
    if store is None or store.strip().lower() in ("memory", "off", ":memory:", "default") or "://" in store:
        return  # a keyword, or a URL (the store setting checks its scheme)
    parent = Path(store).expanduser().parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise InputError(f"argument --store: directory {parent} {why} (create it first, or use --store memory)")


def join_negative_values(argv: list[str]) -> list[str]:
    """`--shape -5x4x4` as `--shape=-5x4x4`, so that the value is checked (argparse takes it for an option).

    Example:
        >>> join_negative_values(["tune", "--shape", "-5x4x4", "--batch", "-2", "-v"])
        ['tune', '--shape=-5x4x4', '--batch=-2', '-v']
    """
    joined: list[str] = []
    i = 0
    while i < len(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i].startswith("--") and "=" not in argv[i] and len(nxt) > 1 and nxt[0] == "-" and nxt[1] in "0123456789.":
            joined.append(f"{argv[i]}={nxt}")
            i += 2
        else:
            joined.append(argv[i])
            i += 1
    return joined


OTHER_TORCH_DEVICES = ("mps", "meta", "xpu", "xla", "hip", "hpu", "mtia", "lazy", "vulkan", "ipu", "ve", "fpga", "maia",
                       "opengl", "opencl", "ideep", "mkldnn", "privateuseone")
"""torch's device types besides cpu and cuda: gemmtune does not tune on them."""


def check_device_spelling(text: str | None) -> None:
    """`--device`: cpu, cuda or cuda:N (None: the default), else an InputError; whether that CUDA device
    exists is `offline.checks.check_device`'s question (it needs torch).

    Example:
        >>> check_device_spelling("cuda:1")
        >>> check_device_spelling("CPU")
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: argument --device: unknown device 'CPU'; expected cpu or cuda (cuda:N) (did you mean 'cpu'?)
    """
    if text is None or re.fullmatch(r"(cpu|cuda)(:[0-9]+)?", text):
        return
    kind = text.partition(":")[0]
    if kind in OTHER_TORCH_DEVICES and re.fullmatch(r"[a-z]+(:[0-9]+)?", text):
        raise InputError(f"argument --device: gemmtune tunes on cpu or cuda, not {kind!r}")
    hint = f" (did you mean {text.lower()!r}?)" if text.lower() != text else ""
    raise InputError(f"argument --device: unknown device {text!r}; expected cpu or cuda (cuda:N){hint}")


def check_problem_args(args: Any) -> None:
    """What can be checked of a command's problem flags before torch is imported: `--device`'s spelling,
    `--dtype`'s name, `--shape`, and `--batch`, which `--op bmm` with a shape requires and only bmm takes.

    Example:
        >>> from argparse import Namespace
        >>> check_problem_args(Namespace(device="cpu", dtype="bf16", shape="8x8x8", op="bmm", batch=2))
        >>> check_problem_args(Namespace(device=None, dtype=None, shape="8x8x8", op="bmm", batch=None))
        Traceback (most recent call last):
        ...
        gemmtune.core.errors.InputError: argument --batch: --op bmm needs the batch size (--batch B)
    """
    check_device_spelling(args.device)
    if args.dtype is not None:
        canonical(args.dtype)
    if getattr(args, "m", None) is not None:
        parse_m(args.m, "argument --m")
    op, batch = getattr(args, "op", "mm"), getattr(args, "batch", None)
    shape = getattr(args, "shape", None)
    if shape is None and getattr(args, "command", "tune") == "tune" and not getattr(args, "suite", None):
        shape = "512x512x512"  # `gemmtune tune`'s default problem
    if shape is None:  # a suite (each shape gives its own batch), or the store's picks
        if batch is not None:
            raise InputError("argument --batch: goes with --shape (a suite gives each shape's own, its \"batch\" key)")
        return
    if op == "bmm" and batch is None:
        raise InputError("argument --batch: --op bmm needs the batch size (--batch B)")
    if op != "bmm" and batch is not None:
        raise InputError(f"argument --batch: only --op bmm takes a batch (this is --op {op})")
    check_dims(*parse_shape(shape), 1 if batch is None else batch)
