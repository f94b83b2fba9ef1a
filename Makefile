# Every command of the project. CI (.ci/run) calls these targets.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTHON ?= python3

.PHONY: help install demo test test-slow test-unit test-db test-e2e lint typecheck bench bench-peers flower docs docs-serve docs-test docs-screenshots clean

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml examples/plugin/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,docs]'
	# The example plugin (examples/plugin): the demo and the tests use its tools.
	$(PY) -m pip install -q -e examples/plugin
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install the project with its dev and docs tools

# mkdocs and its plugins print banners about their own futures on every build.
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true

demo: install  ## migrate, start two workers and beat, run scripted runs end to end
	$(PY) examples/demo.py

# make test: every test but the storms, in 2 processes (pytest-xdist; a test file runs whole
# in one of them, tests/conftest.py); make test-slow: the storms (marked slow),
# alone, as they need the machine to themselves. Together they run the whole suite (CI runs
# both); each prints its ten slowest tests. One test alone: $(VENV)/bin/pytest path::name.
test: install  ## the whole suite but the storm tests (unit, db, e2e, docs), in 2 processes; needs PostgreSQL and Redis
	$(VENV)/bin/pytest -q -n 2 --dist loadfile -m "not slow" --durations=10

test-slow: install  ## the few storm tests (marked slow: rolling kills, crash storms) that make test leaves out
	$(VENV)/bin/pytest -q -p no:xdist -m slow --durations=10

test-unit: install  ## only the in-memory tests (no services)
	$(VENV)/bin/pytest -q tests/unit

test-db: install  ## the PostgreSQL tier (no Redis needed); also: pytest -m db
	$(VENV)/bin/pytest -q tests/db

test-e2e: install  ## real Redis and worker processes; also: pytest -m e2e
	$(VENV)/bin/pytest -q tests/e2e

lint: install  ## ruff and the import contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: install  ## mypy strict
	$(VENV)/bin/mypy

bench: install  ## round cost next to two Celery hops, CPU and bytes per round, in-flight throughput
	$(PY) bench/rounds.py

# make bench-peers: the peers' harness (PEERS_BENCH, read-only; its README says what each script
# measures) in its own virtualenv .peers, then AIDAWORK's round beside it (bench/peers.py).
PEERS_BENCH ?= ../shared/peers-bench
PEERS       := .peers
PEERS_STAMP := $(PEERS)/.installed-stamp
PEERS_OUT   ?= bench/out/peers-$(shell date +%Y%m%d-%H%M%S)

$(PEERS_STAMP): $(wildcard $(PEERS_BENCH)/requirements.txt)
	@test -f $(PEERS_BENCH)/requirements.txt || { echo "bench-peers: no peers' harness at $(PEERS_BENCH) (no requirements.txt there); set PEERS_BENCH=path/to/peers-bench" >&2; exit 1; }
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q --upgrade pip
	$(PEERS)/bin/python -m pip install -q -r $(PEERS_BENCH)/requirements.txt
	touch $(PEERS_STAMP)

bench-peers: install $(PEERS_STAMP)  ## zero-latency round wall time next to LangGraph-PostgresSaver and DBOS at 10 and 500 rounds, with the ratios
	@test -f $(PEERS_BENCH)/c_langgraph.py || { echo "bench-peers: no peers' harness at $(PEERS_BENCH); set PEERS_BENCH=path/to/peers-bench" >&2; exit 1; }
	$(PY) bench/peers.py --out $(PEERS_OUT) --peers-bench $(PEERS_BENCH) --peers-python $(PEERS)/bin/python

flower: install  ## Flower on the same broker, http://127.0.0.1:5555
	$(VENV)/bin/aidawork flower

docs: install  ## build the site strict into site/ (a warning, a broken link or a missing page fails)
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict --quiet

docs-test: install  ## run every python/sh/console block and check every json run request of README.md and docs/ (prints the skipped ones)
	$(VENV)/bin/pytest -q tests/docs

docs-serve: install  ## serve the site with live reload, http://127.0.0.1:8000
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve

docs-screenshots: install  ## retake docs/assets/inspector.png and flower.png from a throwaway stack (headless Chromium)
	$(PY) docs/screenshots.py

clean:
	rm -rf site $(VENV) $(PEERS) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
