# `make test` works on a fresh machine: it builds .venv, installs the project with its test
# extras, then runs the linter (ruff, configured in pyproject.toml) and pytest. `make demo`
# runs the main job on a generated model.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint demo venv clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/python -m ruff check .

test: lint
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/python -m bench.demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
