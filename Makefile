# Quorra: `make run` starts a single-node server; `make lint` checks style and types (ruff,
# mypy --strict); `make test` runs lint first, then the whole suite.
# Each creates and reuses .venv; a stamp per extra reinstalls only when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HTMX_VERSION := 2.0.11
HTMX := static/vendor/htmx.min.js
DATA_DIR ?= ./data
HOST ?= 127.0.0.1
PORT ?= 8000
# The slowest tests are listed after every run, to keep the suite within its time budget.
PYTEST_ARGS ?= --durations=25

.PHONY: run test lint system-test-deps clean

run: $(VENV)/.stamp-base $(HTMX)
	$(VENV)/bin/quorra serve --data-dir $(DATA_DIR) --host $(HOST) --port $(PORT)

# The suite starts many Python processes (servers, CLI commands, bench runs) that
# import app/ and engine/: compiled once here, they read the bytecode instead of each
# compiling ~200 modules again (~0.6 s of CPU of a server's ~2.6 s start) when none is
# cached, as on a clean checkout or under PYTHONDONTWRITEBYTECODE (py_compile writes it).
test: lint $(VENV)/.stamp-dev $(HTMX) system-test-deps
	$(PY) -m compileall -q app engine bench pipeline
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

$(VENV)/.stamp-venv:
	$(PYTHON) -m venv $(VENV)
	touch $@

$(VENV)/.stamp-base: pyproject.toml $(VENV)/.stamp-venv
	$(PY) -m pip install --disable-pip-version-check -q -e .
	touch $@

$(VENV)/.stamp-dev: pyproject.toml $(VENV)/.stamp-venv
	$(PY) -m pip install --disable-pip-version-check -q -e '.[dev]'
	touch $@ $(VENV)/.stamp-base

# htmx is vendored at build time from the npm package, never served from a CDN.
$(HTMX): Makefile
	mkdir -p static/vendor
	tmp=$$(mktemp -d) && cd $$tmp && npm pack --silent htmx.org@$(HTMX_VERSION) >/dev/null \
	  && tar -xzf htmx.org-$(HTMX_VERSION).tgz package/dist/htmx.min.js \
	  && cp package/dist/htmx.min.js $(CURDIR)/$(HTMX) && rm -rf $$tmp
	test -s $(HTMX)

# Browser tests drive Debian's Chromium; the Spark tests need a Java 17 runtime.
system-test-deps:
	@missing=""; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	java -version 2>&1 | grep -q 'version "17' || missing="$$missing openjdk-17-jre-headless"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

clean:
	rm -rf $(VENV) static/vendor
