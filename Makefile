# cowrite: `make run` starts a dev server, `make test` runs every check.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test lint typecheck jstest pytest schema bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(VENV)/.installed $@

run: $(VENV)/.installed
	@echo "cowrite: open http://$(HOST):$(PORT)/ (dev mode, memory backend, scripted model)"
	COWRITE_DEV=$${COWRITE_DEV:-1} COWRITE_HOST=$(HOST) COWRITE_PORT=$(PORT) $(BIN)/python -m server

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

jstest:
	node --test tests/js/

pytest: $(VENV)/.installed-test
	$(BIN)/python -m pytest

test: lint typecheck jstest pytest

schema: $(VENV)/.installed
	$(BIN)/python -m protocol.schema

bench: $(VENV)/.installed-test
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
