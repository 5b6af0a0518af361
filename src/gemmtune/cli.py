"""The `gemmtune` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .core.errors import GemmtuneError
from .report import autotune_table, selection_dict, write_json
from .core.settings import EFFORTS, Settings, effort_help
from .search import STRATEGIES
from .offline.suite import ProblemSpec, load_suite
from .engine import shared_store, tune

err = Console(stderr=True)
out = Console(highlight=False, soft_wrap=True)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gemmtune", description="GEMM autotuner for PyTorch")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tune", help="tune one GEMM (--shape) or a suite of them (--suite)")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--shape", help="MxKxN, for C[M,N] = A[M,K] @ B[K,N] (default 512x512x512)")
    src.add_argument("--suite", help="JSON file of shapes (format of bench/shapes.json)")
    t.add_argument("--op", choices=("mm", "addmm", "bmm"), default="mm")
    t.add_argument("--batch", type=int, default=1, help="batch size for bmm")
    t.add_argument("--dtype", default=None, help="float16|bfloat16|float32|float64 (default: bfloat16 on cuda, "
                   "float32 on cpu; for --suite, each shape's own)")
    t.add_argument("--b-layout", choices=("row", "col"), default="row",
                   help="col: B is the transpose of a contiguous [N,K] weight, as in nn.Linear")
    t.add_argument("--device", default=None, help="cuda|cpu (default: cuda when present)")
    t.add_argument("--strategy", choices=sorted(STRATEGIES), default=None)
    t.add_argument("--top-x", type=int, default=None, help="prescreen: configs kept after stage 1")
    t.add_argument("--effort", choices=tuple(EFFORTS), default=None,
                   help="a preset under the other settings (explicit flags and GEMMTUNE_* variables win). "
                   + effort_help())
    t.add_argument("--budget-s", type=float, default=None,
                   help="cap tuning wall time: stop and return the best so far (library kernels timed first)")
    t.add_argument("--backends", default=None, help="comma-separated families: extern,triton,numba")
    t.add_argument("--json", dest="json_path", default=None, help="write the Selection(s) as JSON here")
    t.add_argument("--rows", type=int, default=None, help="rows of the AUTOTUNE table (default 20)")
    t.add_argument("--store", default=None, help="where picks are kept: a SQLite path, 'memory' or 'off' "
                   "(default: store.sqlite in $GEMMTUNE_CACHE_DIR or ~/.cache/gemmtune)")
    t.add_argument("--lookup-table", default=None, help="JSON table of pinned choices (e.g. a `cache export` file)")
    t.add_argument("--isolation", choices=("auto", "off", "subprocess"), default=None,
                   help="subprocess: checks and timings run in a worker process that may crash or hang safely")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("-v", "--verbose", action="store_true")
    w = sub.add_parser("sweep", help="record every candidate's time for every shape of a suite (resumable)")
    w.add_argument("--suite", required=True, help="JSON file of shapes (format of bench/shapes.json)")
    w.add_argument("--out", required=True, help="dataset to write (JSONL; appended to, so a rerun resumes)")
    w.add_argument("--device", default=None)
    w.add_argument("--dtype", default=None, help="override every shape's dtype")
    w.add_argument("--only", default="", help="comma-separated shape names")
    sub.add_parser("simulate", add_help=False,
                   help="replay search strategies on recorded timings: regret vs work (gemmtune simulate -h)")
    c = sub.add_parser("cache", help="inspect and ship the store of picks")
    c.add_argument("action", choices=("ls", "show", "clear", "export", "import"))
    c.add_argument("arg", nargs="?", help="show: text in the problem key; export/import: JSON file")
    c.add_argument("--store", default=None, help="store location (default: the cache dir's store.sqlite)")
    return p


def cmd_sweep(args: argparse.Namespace) -> int:
    from .offline.sweep import sweep

    specs = load_suite(args.suite, dtype=args.dtype)
    only = {s for s in args.only.split(",") if s}
    specs = [s for s in specs if not only or s.name in only]
    added = sweep(specs, args.out, args.device or default_device(), Settings.from_env(),
                  log=lambda m: out.print(m), command="gemmtune sweep " + " ".join(sys.argv[2:]))
    out.print(f"recorded {added} new shapes in {args.out}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    store = shared_store(Settings.from_env(store=args.store).store)
    if args.action == "ls":
        table = Table(title=f"gemmtune store {store.path}")
        for col in ("problem", "device", "pick", "ms", "timings"):
            table.add_column(col)
        for p in store.problems():
            rt = " ".join(f"{k}={v}" for k, v in p["runtime_params"].items())
            cfg = ",".join(f"{k}={v}" for k, v in p["config"].items())
            table.add_row(p["problem"], str(p["env_info"].get("device")), f"{p['template']} {cfg} {rt}".strip(),
                          f"{p['ms']:.4f}" if p["ms"] is not None else "-", str(p["timings"]))
        out.print(table)
    elif args.action == "show":
        out.print_json(data=store.show(args.arg or ""))
    elif args.action == "clear":
        out.print(f"cleared {store.clear()} picks from {store.path}")
    elif args.action == "export":
        if not args.arg:
            raise ValueError("cache export: give the JSON file to write")
        data = store.export()
        write_json(data, args.arg)
        out.print(f"exported {len(data['entries'])} picks to {args.arg}")
    elif args.action == "import":
        if not args.arg:
            raise ValueError("cache import: give the JSON file to read")
        try:
            data = json.loads(Path(args.arg).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cache import: cannot read {args.arg}: {exc}") from exc
        out.print(f"imported {store.import_(data)} picks into {store.path}")
    return 0


@contextmanager
def progress_listener(enabled: bool) -> Iterator:
    if not enabled:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as prog:
        tasks: dict[str, int] = {}

        def listen(event: str, **info) -> None:
            if event == "choices":
                for k in list(tasks):
                    prog.remove_task(tasks.pop(k))
                tasks["compile"] = prog.add_task("compiling", total=info["binaries"])
                tasks["benchmark"] = prog.add_task("benchmarking", total=info["total"])
            elif event in tasks:
                prog.update(tasks[event], completed=info["done"], total=max(info["total"], info["done"]))

        yield listen


def cmd_tune(args: argparse.Namespace) -> int:
    device = args.device or default_device()
    settings = Settings.from_env(strategy=args.strategy, top_x=args.top_x, backends=args.backends,
                                 effort=args.effort, budget_s=args.budget_s, isolation=args.isolation,
                                 report_rows=args.rows, verbose=args.verbose or None, store=args.store,
                                 lookup_table=args.lookup_table)
    if args.suite:
        specs = load_suite(args.suite, dtype=args.dtype)
    else:
        dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
        specs = [ProblemSpec.parse(args.shape or "512x512x512", op=args.op, batch=args.batch, dtype=dtype,
                                   b_layout=args.b_layout)]
    results = []
    with progress_listener(not args.no_progress and err.is_terminal) as listen:
        for i, spec in enumerate(specs, 1):
            if len(specs) > 1 and not args.no_progress:  # a suite: which shape, of how many
                err.print(f"[{i}/{len(specs)}] {spec.name or spec.describe()}", highlight=False)
            tensors = spec.tensors(device)
            sel = tune(spec.op, *tensors, settings=settings, listener=listen)
            if sel.cache_hit:
                out.print(f"cache hit: {spec.describe()} -> {sel.winner.key} (no benchmarking; "
                          f"{sel.from_store} stored timings, tuned in {sel.tuning_s:.3f} s)")
            elif sel.from_store:
                out.print(f"partial cache hit: {sel.from_store} timings from the store, "
                          f"{sel.benchmark_runs} new benchmark runs")
            if sel.stale_entries:
                out.print(f"ignored {sel.stale_entries} stored timings measured with an older template source")
            out.print(autotune_table(sel, rows=settings.report_rows))
            out.print()
            results.append((spec, sel))
    if len(results) > 1:
        out.print(summary_table(results))
    if args.json_path:
        docs = [{"name": spec.name, **selection_dict(sel)} for spec, sel in results]
        write_json(docs[0] if len(docs) == 1 and not args.suite else {"results": docs}, args.json_path)
    return 0


def summary_table(results) -> Table:
    table = Table(title="gemmtune summary")
    for col in ("shape", "problem", "winner", "ms", "TFLOP/s", "best extern ms", "vs extern", "choices",
                "runs", "tuning s"):
        table.add_column(col, justify="left" if col in ("shape", "problem", "winner") else "right")
    for spec, sel in results:
        ext = [t.ms for t in sel.timings if t.choice.is_extern and t.ms is not None]
        ext_ms = min(ext) if ext else None
        table.add_row(spec.name or "-", spec.describe(), f"{sel.winner.name} {sel.winner.description}",
                      f"{sel.winner_ms:.4f}", f"{sel.problem.flops / sel.winner_ms / 1e9:.1f}",
                      f"{ext_ms:.4f}" if ext_ms else "-", f"{ext_ms / sel.winner_ms:.3f}x" if ext_ms else "-",
                      str(sel.n_choices), str(sel.benchmark_runs), f"{sel.tuning_s:.2f}")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:
        from .offline.simulate import simulate_main

        return simulate_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(message)s")
    try:
        if args.command == "tune":
            return cmd_tune(args)
        if args.command == "cache":
            return cmd_cache(args)
        if args.command == "sweep":
            return cmd_sweep(args)
    except (GemmtuneError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
