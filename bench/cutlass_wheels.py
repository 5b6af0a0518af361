"""Pack the CUTLASS wheels for the GPU machine, which has no network: one `.whl/cutlass/cutlass.tar.xz` holding
nvidia-cutlass-dsl (with its base, core and cu13 libraries) and nvidia-cutlass-operators with its dependencies
(apache-tvm-ffi, torch-c-dlpack-ext), every wheel unzipped and the whole tree packed with xz.  It fits one call's
64 MiB beside the working tree, where the wheels as they come (about 61 MB with the cu13 wheel repacked alone) and
the tree did not; `bench/gpu_run.py cutlass-setup` unpacks it into `.cutedsl/` (carry `.whl/cutlass`).

    python bench/cutlass_wheels.py             # pip download, unzip, pack (about 5 minutes of xz)
    python bench/cutlass_wheels.py --dry-run   # the pip command and where the pack goes

Prints the pack's size and what a call would carry (the tracked and untracked files git does not ignore, plus the pack).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".whl" / "cutlass" / "cutlass.tar.xz"
LIMIT = 64 * 2**20  # what one device call carries: the working tree and the carried paths
PINS = ("nvidia-cutlass-dsl==4.8.1", "nvidia-cutlass-dsl-libs-base==4.8.1", "nvidia-cutlass-dsl-libs-core==4.8.1",
        "nvidia-cutlass-dsl-libs-cu13==4.8.1", "nvidia-cutlass-operators==0.3.0", "apache-tvm-ffi",
        "torch-c-dlpack-ext")
PLATFORMS = (*(f"manylinux_2_{v}_x86_64" for v in (28, 27, 24, 17)), "manylinux2014_x86_64")


def pip_command(dest: Path) -> list[str]:
    """`pip download` of the pinned wheels for the GPU machine's Python (3.12, x86-64 Linux), no deps.

        >>> cmd = pip_command(Path("/tmp/w"))
        >>> cmd[3:5], "nvidia-cutlass-operators==0.3.0" in cmd
        (['download', '--no-deps'], True)
    """
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", *(arg for p in PLATFORMS for arg in ("--platform", p)), "-d", str(dest), *PINS]


def tree_bytes() -> int:
    """Bytes of what a call sends besides carried paths: the files git tracks or does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.split(b"\0")
    return sum((ROOT / name.decode()).stat().st_size for name in listed if name and (ROOT / name.decode()).is_file())


def pack(wheels: Path, out: Path) -> int:
    """Unzip every wheel of `wheels` into one tree and write it to `out` as tar | xz; returns its size."""
    with tempfile.TemporaryDirectory(prefix="cutlass-tree-") as tree:
        for wheel in sorted(wheels.glob("*.whl")):
            zipfile.ZipFile(wheel).extractall(tree)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as f:
            tar = subprocess.Popen(["tar", "-cf", "-", "-C", tree, "."], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-T1", "--x86", "--lzma2=preset=9e,dict=192MiB"], stdin=tar.stdout, stdout=f,
                           check=True)
            if tar.wait():
                raise SystemExit("cutlass_wheels.py: tar failed")
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--dry-run", action="store_true", help="print the pip command and the target; do nothing")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cutlass-wheels-") as tmp:
        cmd = pip_command(Path(tmp))
        if args.dry_run:
            print(" ".join(cmd), f"-> {OUT.relative_to(ROOT)}", sep="\n")
            return 0
        if shutil.which("xz") is None:
            raise SystemExit("cutlass_wheels.py: needs xz")
        subprocess.run(cmd, check=True)
        size = pack(Path(tmp), OUT)
    total = size + tree_bytes()
    print(f"{OUT.relative_to(ROOT)}: {size / 2**20:.1f} MiB; with the working tree {total / 2**20:.1f} MiB of "
          f"{LIMIT / 2**20:.0f}" + ("" if total <= LIMIT else "  (too large for one call)"))
    return 0 if total <= LIMIT else 1


if __name__ == "__main__":
    raise SystemExit(main())
