# Quick start: `make demo` (.venv) and `make test` (.venv-test: the dev extra pins packages the demo
# need not, so the tests keep an environment of their own and leave the demo's as it was).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TVENV  := .venv-test
TBIN   := $(TVENV)/bin

.PHONY: demo test docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch: keep a torch that is already importable; otherwise the CPU build
# (on these machines `pip install torch==2.13.0` takes a local file).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $@

$(TBIN)/python:
	$(PYTHON) -m venv $(TVENV)

$(TVENV)/.dev: pyproject.toml | $(TBIN)/python
	$(TBIN)/python -c "import torch" 2>/dev/null || $(TBIN)/pip install -q torch==2.13.0
	$(TBIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/gemmtune tune --store off
	$(BIN)/gemmtune simulate --strategy exhaustive "prescreen[x=5,swizzle=8]" "model_pruned[n=20]" default

test: $(TVENV)/.dev
	$(TBIN)/python -m mypy
	$(TBIN)/python -m pytest -q

# The generated pages: docs/SETTINGS.md's tables, docs/CLI.md and docs/API.md (tools/docs.py; with --check it
# names a stale page), then docs/RESULTS.md.  In the test environment: pdoc is a dev dependency.
docs: $(TVENV)/.dev
	$(TBIN)/python tools/docs.py
	if [ -f bench/results.py ]; then $(TBIN)/python bench/results.py --write; fi

clean:
	rm -rf $(VENV) $(TVENV)
