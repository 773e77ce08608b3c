# README.md's set-up steps: `make run` starts the platform (the Dagster UI), `make test` runs the lint and
# the whole suite, `make test-fast` the inner loop. Each creates .venv and installs the project on first
# use. `make simulate` replays the traces; `make demo` plays the platform's scripted scenario.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run load-stop simulate demo test test-fast lint bench postgres chromium prometheus clean

# `make run`: the platform's Dagster instance lives under .xirang/ (SQLite storage, the root dagster.yaml).
DAGSTER_HOME_DIR := $(CURDIR)/.xirang/dagster
PORT ?= 3000

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# It also starts scripts/serve-load (XIRANG_LOAD=off: not): the SD serving trace replayed against each
# tenant's inference service, so the autoscaler scales its replicas; `make load-stop` stops it alone.
LOAD_PID := $(CURDIR)/.xirang/load.pid
run: $(STAMP)
	@mkdir -p $(DAGSTER_HOME_DIR)
	@cp dagster.yaml $(DAGSTER_HOME_DIR)/dagster.yaml
	@echo "Xirang: the Dagster UI will be at http://127.0.0.1:$(PORT) (code locations research and product; Ctrl-C stops it)"
	@if [ "$${XIRANG_LOAD:-on}" != off ]; then echo "Load: scripts/serve-load replays the SD trace on each tenant's service once it has a deployed model (log .xirang/load.log; make load-stop)"; fi
	@export CUDA_VISIBLE_DEVICES= DAGSTER_HOME=$(DAGSTER_HOME_DIR) XIRANG_CONFIG=$(CURDIR)/xirang.yaml; \
	if [ "$${XIRANG_LOAD:-on}" != off ]; then BIN=$(BIN) setsid scripts/serve-load & echo $$! > $(LOAD_PID); fi; \
	trap 'test -f $(LOAD_PID) && kill -- -$$(cat $(LOAD_PID)) 2>/dev/null; rm -f $(LOAD_PID)' EXIT; \
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p $(PORT)

load-stop:
	@if [ -f $(LOAD_PID) ]; then kill -- -$$(cat $(LOAD_PID)) && rm -f $(LOAD_PID) && echo "load generator stopped"; else echo "no load generator runs (no $(LOAD_PID))"; fi

# The simulator on its own: two tenants' real training traces contending for 64 G2 nodes (512 GPUs),
# with preemption, reclaim and return (about 75 s of CPU), its report in out/replay/index.html; then FGD's fill
# method on the openb cluster under our placement policy.
ITP := data/traces/microsoft_itp_elasticflow_2021
simulate: $(STAMP)
	$(BIN)/xirang simulate --nodes data/pools/openb_g2_64.csv \
	  --jobs $(ITP)/cluster04.csv:online-training:research/llm \
	  --jobs $(ITP)/cluster02.csv:offline-training:product/ranking \
	  --tenants data/tenants.example.yaml --limit 2500 --interval 60 --report out/replay
	$(BIN)/xirang simulate --mode fill --placement xirang --seed 42

demo: $(STAMP)
	$(BIN)/xirang demo

postgres:
	scripts/ensure-postgres

# The UI tests render the Dagster UI in Debian's headless chromium.
chromium:
	scripts/ensure-chromium

# The exporter's tests scrape it with Debian's Prometheus server.
prometheus:
	scripts/ensure-prometheus

# Lint, format, types and the import contracts (the layers): the settings are in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy xirang_platform resources sensors
	$(BIN)/lint-imports

test: lint postgres chromium prometheus
	$(BIN)/python -m pytest -q

# The inner loop (CONTRIBUTING.md says when to run which): the layers below Dagster, that is the pure
# core, the pool, the ledger on SQLite and PostgreSQL, the platform layer and the simulator, plus the
# repository-wide checks at the top of tests/. No lint, no Dagster instance, browser or Prometheus, and
# no `stress` test (the ledger's eight concurrent writers, over 20 s on two shared cores).
FAST_TESTS := tests/scheduling tests/pool tests/ledger tests/platform tests/simulate $(wildcard tests/test_*.py)
test-fast: $(STAMP) postgres
	$(BIN)/python -m pytest -q -m "not stress" $(FAST_TESTS)

bench: $(STAMP) postgres
	$(BIN)/python bench/cycle_speed.py
	$(BIN)/python bench/placement_openb.py
	$(BIN)/python bench/ledger.py
	$(BIN)/python bench/dagster_admission.py

clean:
	rm -rf $(VENV) .xirang .pytest_cache .hypothesis
