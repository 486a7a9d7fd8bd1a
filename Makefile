# `make test` works on a fresh machine: it builds .venv, installs the project with its test
# extras, then runs pytest. `make demo` runs the main job on a generated model.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo venv clean bench

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/python -m bench.demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
