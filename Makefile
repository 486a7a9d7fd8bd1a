# `make test` works on a fresh machine: it builds .venv, installs the project with its test
# extras (compiling the reader's per-piece modules when a C compiler is at hand: setup.py), then
# runs the linter (ruff, configured in pyproject.toml), pytest, and the reader's tests once more
# with its Python modules (REPLICA_TUNER_PURE=1), which decide exactly as the compiled ones.
# `make demo` runs the main job on a generated model.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint demo venv clean

# a change to the reader installs again: its compiled modules are built from those sources
$(STAMP): pyproject.toml setup.py $(wildcard engine_bridge/reader/*.py)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/python -m ruff check .

test: lint
	$(BIN)/python -m pytest
	REPLICA_TUNER_PURE=1 $(BIN)/python -m pytest tests/engine_bridge/test_reader_*.py

demo: $(STAMP)
	$(BIN)/python -m bench.demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache
	rm -f engine_bridge/reader/*.so engine_bridge/reader/native.sources engine_bridge/reader/native.failed
