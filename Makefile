# cowrite: `make run` starts a dev server, `make test` runs every check.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
# Where `make run` listens: `make run PORT=9000` wins, then COWRITE_PORT / COWRITE_HOST from
# the environment, then PORT / HOST from the environment (as a PaaS sets them), then defaults.
ifneq ($(origin PORT),command line)
  PORT := $(or $(COWRITE_PORT),$(PORT),8000)
endif
ifneq ($(origin HOST),command line)
  HOST := $(or $(COWRITE_HOST),$(HOST),127.0.0.1)
endif
# -qq: pip prints errors only (no setuptools editable-install notice, no warnings about this
# machine's pip configuration); a failed install still says why.
PIP := $(BIN)/python -m pip install -qq

NODE_DIR := tests/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed

.PHONY: run test lint typecheck jstest adapters-jstest pytest schema docs node-deps bench clean

$(BIN)/python:
	@echo "cowrite: creating $(VENV) (first run only)"
	@$(PYTHON) -m venv $(VENV)
	@$(PIP) --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@echo "cowrite: installing into $(VENV)"
	@$(PIP) -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	@echo "cowrite: installing into $(VENV) with the test extra"
	@$(PIP) -e '.[test]'
	@touch $(VENV)/.installed $@

# The server prints the one line that matters: the URL it really listens on. The venv comes
# first on PATH, so `python` in COWRITE_CONFIG (an MCP server's command) is the project's.
run: $(VENV)/.installed
	@PATH="$(abspath $(BIN)):$$PATH" COWRITE_DEV=$${COWRITE_DEV:-1} COWRITE_HOST=$(HOST) COWRITE_PORT=$(PORT) exec $(BIN)/python -m server

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

jstest:
	node --test tests/js/

pytest: $(VENV)/.installed-test
	$(BIN)/python -m pytest --durations=25

# The AI SDK / AG-UI adapters driven by the real `ai` and `@ag-ui/client` packages
# (tests/node/adapters.test.mjs starts its own server from .venv).
adapters-jstest: node-deps $(VENV)/.installed
	@if [ -d $(NODE_DIR)/node_modules/ai ]; then node --test $(NODE_DIR)/adapters.test.mjs $(NODE_DIR)/adapters_cluster.test.mjs; \
	elif [ "$$CI" = "true" ]; then echo "node and npm are required in CI" >&2; exit 1; \
	else echo "npm packages missing: skipping the adapter node tests" >&2; fi

test: node-deps lint typecheck jstest adapters-jstest pytest

# npm packages for the TypeScript checks (tests/node), installed from the lock
# file whenever it changes. Without npm: CI fails here; elsewhere the checks skip.
node-deps:
	@if command -v npm >/dev/null 2>&1; then $(MAKE) -s --no-print-directory $(NODE_STAMP); \
	elif [ "$$CI" = "true" ]; then echo "npm is required in CI (.ci/run installs it)" >&2; exit 1; \
	else echo "npm not found: skipping the TypeScript checks (apt-get install npm)" >&2; fi

$(NODE_STAMP): $(NODE_DIR)/package-lock.json $(NODE_DIR)/package.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error >/dev/null
	touch $@

# schema.json, the tables in docs/protocol.md and static/protocol.d.ts, from the models.
docs: $(VENV)/.installed node-deps
	$(BIN)/python -m protocol.schema
	$(BIN)/python -m protocol.reference
	node $(NODE_DIR)/gen-types.mjs

schema: docs

bench: $(VENV)/.installed-test
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info $(NODE_DIR)/node_modules
