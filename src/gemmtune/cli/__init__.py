"""The `gemmtune` command line."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from rich.console import Console
from rich.text import Text

from ..core.errors import GemmtuneError, InputError
from ..core.settings import Settings
from ..offline.cli_args import check_problem_args, check_store_arg, flag_named, join_negative_values
from .parser import OneLineParser, add_inductor_parser, build_parser  # noqa: F401 - re-exported

if TYPE_CHECKING:  # the commands import what they need when they run: `gemmtune --help` imports no torch
    from ..offline.suite import ProblemSpec

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def tune(*args, **kwargs):
    """`gemmtune.tune`, imported when a command first tunes."""
    from ..engine import tune as tune_

    return tune_(*args, **kwargs)


def check_device(text: str | None) -> str:
    """`offline.checks.check_device`, imported when a command first needs it (no torch for `--help`)."""
    from ..offline.checks import check_device as check

    return check(text)


def check_fits(spec: "ProblemSpec", device: str, arg: str) -> None:
    """`offline.checks.check_fits`, imported when a command first needs it."""
    from ..offline.checks import check_fits as check

    check(spec, device, arg)


def cmd_inductor_table(args: argparse.Namespace) -> int:
    check_problem_args(args)  # before torch is imported
    from .. import inductor
    from ..engine import shared_store
    from ..offline.suite import ProblemSpec, load_suite

    inductor.require()
    if args.few < 1:
        raise InputError(f"argument --few: expected a positive integer, got {args.few}")
    settings = Settings.from_env(store=args.store)
    skipped: tuple[str, ...] = ()
    if args.suite or args.shape:
        device = check_device(args.device)
        dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
        specs = (load_suite(args.suite, dtype=args.dtype) if args.suite else
                 [ProblemSpec.parse(args.shape, op=args.op, batch=args.batch or 1, dtype=dtype,
                                    b_layout=args.b_layout)])
        for spec in specs:
            check_fits(spec, device, "--suite" if args.suite else "--shape")
        picks = inductor.tuned_picks(((s.op, s.tensors(device)) for s in specs), settings, args.templates, args.few)
        table = inductor.table_for(picks)
    else:
        if args.device not in (None, "cpu", "cuda"):
            raise InputError(f"argument --device: expected cpu or cuda to filter the store, got {args.device!r}")
        made = inductor.export_table(shared_store(settings.store), args.device, args.few)
        table, skipped, picks = made.table, made.skipped, list(made.picks)
    inductor.write_table(table, args.out)
    exact = sum(p.exact for p in picks)
    out.print(f"wrote {len(table)} keys for {len(picks)} problems ({exact} exact picks) to {args.out}")
    for why in skipped:
        out.print(f"skipped {why}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    check_problem_args(args)  # before torch is imported
    from ..offline.suite import load_suite
    from ..offline.sweep import sweep

    specs = load_suite(args.suite, dtype=args.dtype)
    only = {s for s in args.only.split(",") if s}
    specs = [s for s in specs if not only or s.name in only]
    device = check_device(args.device)
    for spec in specs:
        check_fits(spec, device, "--suite")
    from ..offline.gpus import slots_for

    settings = Settings.from_env(backends=args.backends, gpus=args.gpus)
    added = sweep(specs, args.out, device, settings, log=lambda m: out.print(m),
                  command="gemmtune sweep " + " ".join(sys.argv[2:]), slots=slots_for(device, settings.gpus),
                  rounds=args.rounds)
    out.print(f"recorded {added} new shapes in {args.out}")
    return 0


def _listener(args: argparse.Namespace):
    """The bar on a terminal, stage lines off one, nothing with --no-progress or -v (the logs say it)."""
    if args.no_progress or args.verbose:
        return nullcontext()
    if err.is_terminal:
        from ..report import progress_listener

        return progress_listener(err)
    return _lines()


@contextmanager
def _lines() -> Iterator:
    from ..pipeline.progress import StageLines, write_stderr

    yield StageLines(write_stderr)


def _print_selection(spec: "ProblemSpec", sel, settings: Settings) -> None:
    from ..report import autotune_table

    from ..core.text import fit

    lines = []
    if sel.cache_hit:
        lines.append(f"cache hit: {spec.describe()} -> {sel.winner.key} (no benchmarking; "
                     f"{sel.from_store} stored timings, tuned in {sel.tuning_s:.3f} s)")
    elif sel.from_store:
        lines.append(f"partial cache hit: {sel.from_store} timings from the store, "
                     f"{sel.benchmark_runs} new benchmark runs")
    if sel.stale_entries:
        lines.append(f"ignored {sel.stale_entries} stored timings measured with an older template source")
    lines.append(autotune_table(sel, rows=settings.report_rows, width=out.width, legend=bool(settings.verbose)))
    out.print("\n".join(fit(lines, out.width)), markup=False)
    out.print()


def _specs(args: argparse.Namespace, device: str) -> "list[ProblemSpec]":
    """The problems `gemmtune tune` was asked for: the suite's, or the one of `--shape` and its flags."""
    from ..offline.suite import ProblemSpec, load_suite

    if args.suite:
        for flag, key, given in (("--scales", "scales", args.scales), ("--out-dtype", "out_dtype", args.out_dtype),
                                 ("--fast-accum", "fast_accum", args.fast_accum)):
            if given:
                raise InputError(f"argument {flag}: a suite gives each shape's own (its \"{key}\" key); "
                                 f"pass {flag} with --shape")
        return load_suite(args.suite, dtype=args.dtype)
    fp8 = args.op == "scaled_mm"
    dtype = args.dtype or ("float8_e4m3fn" if fp8 else "bfloat16" if device.startswith("cuda") else "float32")
    return [ProblemSpec.parse(args.shape or "512x512x512", op=args.op, batch=args.batch or 1, dtype=dtype,
                              b_layout=args.b_layout or ("col" if fp8 else "row"),
                              scales=args.scales or ("tensorwise" if fp8 else ""), out_dtype=args.out_dtype or "",
                              fast_accum=args.fast_accum)]


def cmd_tune(args: argparse.Namespace) -> int:
    check_problem_args(args)  # the flags torch is not needed for, before it is imported
    settings = Settings.from_env(strategy=args.strategy, top_x=args.top_x, backends=args.backends,
                                 effort=args.effort, budget_s=args.budget_s, isolation=args.isolation,
                                 report_rows=args.rows, verbose=bool(args.verbose) or None, store=args.store,
                                 lookup_table=args.lookup_table, gpus=args.gpus)
    device = check_device(args.device)
    specs = _specs(args, device)
    if args.m is not None:  # every bucket of M of each shape
        specs = _at_buckets(specs, args.m)
    for spec in specs:  # before anything is allocated
        check_fits(spec, device, "--suite" if args.suite else "--shape")
    store, dealt = _deal(specs, settings, device) if args.suite else (None, {})
    results = []
    for i, spec in enumerate(specs, 1):
        if i - 1 in dealt and not dealt[i - 1].ok:
            out.print(f"{spec.describe()}: failed on {', '.join(dealt[i - 1].lost_on) or dealt[i - 1].label}: "
                      f"{dealt[i - 1].error}")
            continue
        if len(specs) > 1 and not args.no_progress:  # a suite: which shape, of how many
            err.print(f"[{i}/{len(specs)}] {spec.name or spec.describe()}", highlight=False)
        tensors = spec.tensors(device)
        with _listener(args) as listen:  # the bar is gone before the table prints
            sel = tune(spec.op, *tensors, settings=settings, listener=listen, store=store, progress=False,
                       **spec.tune_kwargs)
        if dealt:  # a worker tuned it: this was the store's answer
            from ..offline.gpus import with_facts

            sel = with_facts(sel, dealt[i - 1])
        results.append((spec, sel))
        if args.json_path:  # before the table: a reader that stops reading (`| head`) still gets the file
            _write_results(results, args)
        if dealt:
            out.print(f"tuned on {dealt[i - 1].label} ({dealt[i - 1].kind})")
        _print_selection(spec, sel, settings)
    if len(results) > 1:
        from ..report import summary_table

        out.print(summary_table(results))
    return 1 if any(not d.ok for d in dealt.values()) else 0


def _at_buckets(specs: list, m: str) -> list:
    """Each spec at every power-of-two M of `m` ("LO:HI"); a named one named `<name>-m<M>`."""
    from dataclasses import replace

    from ..core.m_range import parse_m
    from ..dispatch.buckets import buckets_for

    return [replace(spec, M=b, name=f"{spec.name}-m{b}" if spec.name else "")
            for spec in specs for b in buckets_for(parse_m(m, "argument --m"))]


def _write_results(results: list, args: argparse.Namespace) -> None:
    """`--json`: the Selections so far (a suite's file is rewritten after each shape)."""
    from ..report import run_info, selection_dict, write_json

    docs = [{"name": spec.name, **selection_dict(sel)} for spec, sel in results]
    doc = docs[0] if len(docs) == 1 and not args.suite else {"results": docs}
    write_json({**doc, **run_info()}, args.json_path)


def _deal(specs: "list[ProblemSpec]", settings: Settings, device: str) -> tuple:
    """A suite on more than one GPU (`--gpus`): each shape tuned in one GPU's worker (offline/gpus.py)."""
    from ..offline import gpus

    slots = gpus.slots_for(device, settings.gpus)
    if not slots:
        return None, {}
    return gpus.deal_suite(specs, settings, settings.store, device, slots,
                           lambda line: err.print(f"gemmtune: {line}", highlight=False))


INTERRUPTED = "interrupted; nothing was stored for the current problem"


def _on_sigint(signum: int, frame: object) -> None:
    """Ctrl-C: one line, exit 130 at once: compile threads and worker processes cannot be joined promptly,
    so `os._exit` skips them.  The store is left as a `kill -9` leaves it: SQLite drops a transaction
    that was not committed when the file is next opened (closing it here, from the main thread, while
    the command's thread is inside SQLite, could crash the process)."""
    import os

    try:
        sys.stdout.flush()
        sys.stderr.write(INTERRUPTED + "\n")
        sys.stderr.flush()
    finally:
        os._exit(130)


def install_sigint_handler() -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `gemmtune` command; returns the exit status (0 ok, 2 a bad argument or input).

    Example:
        >>> main(["tune", "--device", "tpu"])  # prints "gemmtune: error: argument --device: ..." on stderr
        2
    """
    if argv is None:  # the `gemmtune` program itself (not a call from Python): Ctrl-C exits at once
        import warnings

        warnings.showwarning = _one_line_warning
        install_sigint_handler()
        return abandonable(lambda: run(sys.argv[1:]))
    return run(argv)


def abandonable(command: Callable[[], int]) -> int:
    """`command()` run in a worker thread while the main thread waits, so that Ctrl-C exits at once.

    Python runs a signal handler in the main thread only, between two bytecodes: a main thread inside
    one long C call (a float64 reference or a library GEMM of a large problem: 20 s on CPU) would
    run it only when that call returns.  Here the main thread only waits, in slices of 0.1 s, and runs
    `_on_sigint` within one slice, whichever thread the signal reached.

    Example:
        >>> abandonable(lambda: 3)
        3
    """
    import threading

    result: list[int] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.append(command())
        except BaseException as exc:  # noqa: BLE001 - raised again in the main thread
            failure.append(exc)

    worker = threading.Thread(target=work, name="gemmtune-command", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if failure:
        raise failure[0]
    return result[0]


def run(argv: Sequence[str]) -> int:
    """`main` for the arguments `argv` (no program name), in the calling thread.  A reader of stdout that
    goes away (`| head`) ends the command quietly, exit 0 (`cli/pipe.py`)."""
    from .pipe import reader_gone, stdout_closed

    try:
        return _run(list(argv))
    except BrokenPipeError:
        if not stdout_closed():
            raise
        return reader_gone()
    except SystemExit as exc:  # rich's Console on a closed pipe: stdout already points at /dev/null
        if isinstance(exc.__context__, BrokenPipeError):
            return 0
        raise


def _run(argv: list[str]) -> int:
    configure_consoles()
    if argv[:1] == ["simulate"]:
        from ..offline.simulate import simulate_main

        return simulate_main(argv[1:])
    try:
        args = build_parser().parse_args(join_negative_values(argv))
    except SystemExit as exc:  # --help, --version, or a usage error already printed on one line
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    configure_logging(args.verbose)
    try:
        check_store_arg(getattr(args, "store", None))
        if args.command == "tune":
            return cmd_tune(args)
        if args.command == "cache":
            from .cache import cmd_cache

            return cmd_cache(args)
        if args.command == "sweep":
            return cmd_sweep(args)
        if args.command == "inductor-table":
            return cmd_inductor_table(args)
    except (GemmtuneError, ValueError, MemoryError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            from .pipe import stdout_closed

            if stdout_closed():  # the reader went away: `run` ends quietly
                raise
        return fail(flag_named(str(exc)))
    except Exception as exc:  # noqa: BLE001 - a bug: one line, the traceback under -vv
        if args.verbose >= 2:
            raise
        return fail(f"internal error: {type(exc).__name__}: {exc} (run with -vv for the traceback)", status=1)
    return 1


# -- one-line errors, consoles and logging ----------------------------------------------------------

def fail(message: str, status: int = 2, prog: str = "gemmtune") -> int:
    """Print `message` as one `gemmtune: error: ...` line on stderr; return `status`."""
    line = " ".join(str(message).split())
    if err.is_terminal:
        err.print(Text.assemble((f"{prog}: error: ", "red"), line), soft_wrap=True)
    else:
        sys.stderr.write(f"{prog}: error: {line}\n")
        sys.stderr.flush()
    return status


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """The `gemmtune` command's warnings: one `gemmtune: warning: ...` line, no source line."""
    text = " ".join(str(message).split())
    sys.stderr.write(f"gemmtune: warning: {text.removeprefix('gemmtune: ')}\n")


def configure_consoles() -> None:
    """Consoles of `core.text.output_width` columns: `COLUMNS` or a terminal's width, at most 100; 100
    where stdout (stderr) is not a terminal.  Tables fit that width and text wraps to it between words
    (a word longer than the width folds): nothing is cut.  A one-line error (`fail`) stays one line."""
    from ..core.text import output_width

    global out, err
    out = Console(highlight=False, width=output_width(sys.stdout))
    err = Console(stderr=True, highlight=False, width=output_width(sys.stderr))


def configure_logging(verbose: int) -> None:
    """-v: INFO logs of the "gemmtune" logger (phases, the pick); -vv: DEBUG (every choice timed).  Other libraries stay at WARNING."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    level = {0: logging.NOTSET, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.getLogger("gemmtune").setLevel(level)
