"""The `gemmtune` command line's parser: one sub-parser per command, usage errors on one line."""

from __future__ import annotations

import argparse

from ..core.settings import EFFORTS, STRATEGY_NAMES, effort_help
from ..core.version import __version__


def build_parser() -> argparse.ArgumentParser:
    """The `gemmtune` parser: tune, sweep, simulate (its own parser), cache, inductor-table.

    Example:
        >>> build_parser().parse_args(["tune", "--shape", "64x64x64"]).shape
        '64x64x64'
    """
    p = OneLineParser(prog="gemmtune", description="GEMM autotuner for PyTorch")
    p.add_argument("--version", action="version", version=f"gemmtune {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="-v: phase boundaries and the pick (INFO logs); -vv: also every choice timed (DEBUG)")
    sub = p.add_subparsers(dest="command", required=True)
    add_tune_parser(sub)
    add_sweep_parser(sub)
    sub.add_parser("simulate", add_help=False,
                   help="replay search strategies on recorded timings: regret vs work (gemmtune simulate -h)")
    add_cache_parser(sub)
    add_inductor_parser(sub)
    return p


def add_tune_parser(sub: argparse._SubParsersAction) -> None:
    """`gemmtune tune`: one GEMM (--shape) or a suite of them (--suite)."""
    t = sub.add_parser("tune", help="tune one GEMM (--shape) or a suite of them (--suite)")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--shape", help="MxKxN, for C[M,N] = A[M,K] @ B[K,N] (default 512x512x512)")
    src.add_argument("--suite", help="JSON file of shapes (format of bench/shapes.json)")
    t.add_argument("--op", choices=("mm", "addmm", "bmm", "scaled_mm"), default="mm",
                   help="mm: A @ B; addmm: bias + A @ B (a bias of N); bmm: batched, --batch B; scaled_mm: "
                   "torch._scaled_mm, fp8 A and B with scales, bfloat16 out (docs/FP8.md) (default mm)")
    t.add_argument("--batch", type=int, default=None, help="bmm's batch size (required with --op bmm)")
    t.add_argument("--dtype", default=None, help="float16|bfloat16|float32|float64, or for scaled_mm "
                   "float8_e4m3fn|float8_e5m2 (default: bfloat16 on cuda, float32 on cpu, float8_e4m3fn for "
                   "scaled_mm; for --suite, each shape's own)")
    t.add_argument("--scales", choices=("tensorwise", "rowwise"), default=None,
                   help="scaled_mm's scales: one per tensor, or per row of A and per column of B "
                   "(default tensorwise)")
    t.add_argument("--out-dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help="scaled_mm's output dtype (default bfloat16; row-wise scales take float16 and float32 only "
                   "where torch does: docs/FP8.md)")
    t.add_argument("--fast-accum", action="store_true",
                   help="scaled_mm with use_fast_accum=True: fast-accumulating kernels compete (docs/FP8.md)")
    t.add_argument("--b-layout", choices=("row", "col"), default=None,
                   help="col: B is the transpose of a contiguous [N,K] weight, as in nn.Linear (default row; "
                   "scaled_mm: col, the only layout torch allows)")
    t.add_argument("--device", default=None, help="cuda|cpu (default: cuda when present)")
    t.add_argument("--strategy", choices=sorted(STRATEGY_NAMES), default=None,
                   help="search strategy (default: the settings' strategy; docs/ARCHITECTURE.md, Search)")
    t.add_argument("--top-x", type=int, default=None, help="prescreen: configs kept after stage 1")
    t.add_argument("--effort", choices=tuple(EFFORTS), default=None,
                   help="a preset under the other settings (explicit flags and GEMMTUNE_* variables win). "
                   + effort_help())
    t.add_argument("--budget-s", type=float, default=None,
                   help="cap tuning wall time: stop and return the best so far (library kernels timed first)")
    t.add_argument("--backends", default=None, help="comma-separated families: extern (torch's library kernels), "
                   "numpy, triton, numba, cutlass (default: the device's own; docs/GETTING_STARTED.md)")
    t.add_argument("--m", metavar="LO:HI", help="tune each shape at every power-of-two M from LO's bucket to HI's")
    t.add_argument("--json", dest="json_path", default=None, help="write the Selection(s) as JSON here")
    t.add_argument("--rows", type=int, default=None, help="rows of the AUTOTUNE table (default 20)")
    t.add_argument("--store", default=None, help="where picks are kept: a SQLite path, 'memory', 'off' or "
                   "redis://HOST:PORT/DB (default: store.sqlite in $GEMMTUNE_CACHE_DIR or ~/.cache/gemmtune)")
    t.add_argument("--lookup-table", default=None, help="JSON table of pinned choices (e.g. a `cache export` file)")
    t.add_argument("--gpus", type=int, default=None,
                   help="--suite on cuda: deal the shapes across at most N of the visible GPUs, one worker process each "
                   "(default: every visible GPU; 1: one GPU; docs/SCALE.md)")
    t.add_argument("--isolation", choices=("auto", "off", "subprocess"), default=None,
                   help="subprocess: checks and timings run in a worker process that may crash or hang safely")
    t.add_argument("--no-progress", action="store_true", help="no progress bar, stage lines or [i/n] suite lines")
    t.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                   help="-v: phase boundaries and the pick (INFO logs); -vv: also every choice timed (DEBUG)")


def add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    """`gemmtune sweep`: every candidate's time for every shape of a suite."""
    w = sub.add_parser("sweep", help="record every candidate's time for every shape of a suite (resumable)")
    w.add_argument("--suite", required=True, help="JSON file of shapes (format of bench/shapes.json)")
    w.add_argument("--out", required=True, help="dataset to write (JSONL; appended to, so a rerun resumes)")
    w.add_argument("--device", default=None, help="cuda|cpu (default: cuda when present)")
    w.add_argument("--dtype", default=None, help="override every shape's dtype")
    w.add_argument("--only", default="", help="comma-separated shape names")
    w.add_argument("--backends", default=None,
                   help="comma-separated families to sweep (default: the device's own; e.g. extern,cutlass)")
    w.add_argument("--gpus", type=int, default=None,
                   help="on cuda: deal the shapes across at most N of the visible GPUs, one worker process each "
                   "(default: every visible GPU; 1: one GPU; docs/SCALE.md)")
    w.add_argument("--rounds", type=int, default=0,
                   help="then re-time every correct choice in N interleaved rounds and record their median and "
                   "spread (default 0: each choice's own timing; on cpu only those within 2x of the fastest)")


def add_cache_parser(sub: argparse._SubParsersAction) -> None:
    """`gemmtune cache`: inspect and ship the store of picks."""
    c = sub.add_parser("cache", help="inspect and ship the store of picks",
                       epilog="show: each problem whose key contains ARG (its pick, time and fastest timings; "
                       "--json: every stored timing); exit 1 when none matches.  clear: asks first where stdin is "
                       "a terminal, else needs --yes (without it: exit 2, nothing deleted).  check: read every "
                       "entry of the store through the store's schema (and, with "
                       "GEMMTUNE_STORE_KEY, its signature) and print one line per bad entry (store, key, why), "
                       "then a summary; exit 0 when every entry is good, 1 when bad entries were found, 2 when "
                       "the store cannot be read.  import is an act of trust: with a key, what it imports is "
                       "signed under that key.")
    c.add_argument("action", choices=("ls", "show", "clear", "export", "import", "check"),
                   help="ls: list the stored problems, and the families stored at several M with the pick per M; "
                   "show: the rows of the problems whose key holds ARG; clear: delete; export / import: a lookup "
                   "table; check: list entries that fail the schema or their signature")
    c.add_argument("arg", nargs="?", help="show: text in the problem key; export/import: JSON file")
    c.add_argument("--json", action="store_true", help="show: every stored timing as JSON (default: a summary)")
    c.add_argument("-y", "--yes", action="store_true", help="clear: do not ask first (needed where stdin is "
                   "not a terminal)")
    c.add_argument("--store", default=None, help="store location: a SQLite path or redis://HOST:PORT/DB (default: the "
                   "cache dir's store.sqlite)")




def add_inductor_parser(sub: argparse._SubParsersAction) -> None:
    """`gemmtune inductor-table`: gemmtune's picks as an Inductor lookup table (docs/MODELS.md)."""
    i = sub.add_parser("inductor-table", help="write gemmtune's picks as an Inductor lookup table (JSON)")
    isrc = i.add_mutually_exclusive_group()
    isrc.add_argument("--suite", help="tune (or read from the store) the shapes of this suite file")
    isrc.add_argument("--shape", help="MxKxN: tune (or read from the store) this one problem")
    i.add_argument("--out", required=True, help="JSON file to write ({key: [entries]})")
    i.add_argument("--op", choices=("mm", "addmm", "bmm"), default="mm", help="--shape's op (default mm)")
    i.add_argument("--batch", type=int, default=None, help="--shape with --op bmm: the batch size (required)")
    i.add_argument("--dtype", default=None, help="float16|bfloat16|float32|float64 (default: bfloat16 on cuda, "
                   "float32 on cpu; for --suite, each shape's own)")
    i.add_argument("--b-layout", choices=("row", "col"), default="row",
                   help="col: B is the transpose of a contiguous [N,K] weight, as in nn.Linear")
    i.add_argument("--device", default=None, help="store: only this device's picks; --shape/--suite: tune here")
    i.add_argument("--store", default=None, help="the store to read (and write when tuning)")
    i.add_argument("--templates", choices=("inductor", "all"), default="inductor",
                   help="inductor: tune among the templates Inductor builds exactly; all: every template")
    i.add_argument("--few", type=int, default=2, help="Triton configs exported for a pick Inductor cannot build")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit status 2.

    Example:
        >>> OneLineParser(prog="gemmtune").error("argument --shape: expected one argument")
        Traceback (most recent call last):
        ...
        SystemExit: 2
    """

    def error(self, message: str):  # type: ignore[override]
        from . import fail  # the consoles live with the commands

        fail(f"{message} (see {self.prog} -h)", prog=self.prog.split()[0])
        raise SystemExit(2)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse's, but an unknown argument is reported by the subcommand's parser (`gemmtune tune -h`)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            subs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
            sub = subs[0].choices.get(getattr(ns, subs[0].dest, None)) if subs else None
            (sub or self).error(f"unrecognized arguments: {' '.join(extras)}")
        return ns
