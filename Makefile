# Quick start: `make demo` and `make test` (each creates .venv on first use).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch: keep a torch that is already importable; otherwise the CPU build
# (on these machines `pip install torch==2.13.0` takes a local file).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.dev: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/gemmtune tune --store off
	$(BIN)/gemmtune simulate --strategy exhaustive "prescreen[x=5,swizzle=8]" "model_pruned[n=20]" default

test: $(VENV)/.dev
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
