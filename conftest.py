"""Collection rules for the whole repository (`testpaths` includes src/gemmtune for its doctests)."""

import importlib.util

# The CuTe DSL kernel source imports `cutlass` at module level: without the optional extra
# (`gemmtune[cutlass]`) its doctest collection would fail, so it is left out.
collect_ignore = []
if importlib.util.find_spec("cutlass") is None:
    collect_ignore.append("src/gemmtune/templates/cutlass/hopper_kernel.py")
