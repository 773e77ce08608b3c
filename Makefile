# README.md's set-up steps: `make run` starts the platform (the Dagster UI), `make test` runs the lint and
# the whole suite, `make test-fast` the inner loop. Each creates .venv and installs the project on first
# use. `make simulate` replays the traces; `make demo` plays the platform's scripted scenario.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run load-stop simulate demo test test-fast lint bench postgres chromium prometheus clean

# `make run`: the platform's state lives under XIRANG_STATE (.xirang/): the ledger, and the Dagster
# instance (SQLite storage under DAGSTER_HOME, the root dagster.yaml copied there).
XIRANG_STATE ?= $(CURDIR)/.xirang
DAGSTER_HOME_DIR := $(XIRANG_STATE)/dagster
PORT ?= 3000

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# It also starts scripts/serve-load (XIRANG_LOAD=off: not): the SD serving trace replayed against each
# tenant's inference service, so the autoscaler scales its replicas; `make load-stop` stops it alone.
# Ctrl-C stops everything: `dagster dev` its servers, then the INT trap the load's process group (a
# shell's EXIT trap alone does not run when SIGINT kills it). `dagster dev` runs in DAGSTER_HOME, the
# folder of the dagster.yaml it uses (elsewhere it warns that a dagster.yaml in its folder is unused);
# the ledger stays in XIRANG_STATE.
LOAD_PID := $(XIRANG_STATE)/load.pid
run: $(STAMP)
	@mkdir -p $(DAGSTER_HOME_DIR)
	@cp dagster.yaml $(DAGSTER_HOME_DIR)/dagster.yaml
	@echo "Xirang: the Dagster UI will be at http://127.0.0.1:$(PORT) (code locations research and product; Ctrl-C stops it)"
	@if [ "$${XIRANG_LOAD:-on}" != off ]; then echo "Load: scripts/serve-load replays the SD trace on each tenant's service once it has a deployed model (log $(XIRANG_STATE)/load.log; make load-stop)"; fi
	@export CUDA_VISIBLE_DEVICES= DAGSTER_HOME=$(DAGSTER_HOME_DIR) XIRANG_CONFIG=$(CURDIR)/xirang.yaml \
	  XIRANG_LEDGER_URL="$${XIRANG_LEDGER_URL:-sqlite:///$(XIRANG_STATE)/ledger.sqlite}" XIRANG_LOAD_LOG=$(XIRANG_STATE)/load.log; \
	stop_load() { test -f $(LOAD_PID) && kill -- -$$(cat $(LOAD_PID)) 2>/dev/null; rm -f $(LOAD_PID); }; \
	trap stop_load EXIT; trap 'exit 130' INT TERM; \
	if [ "$${XIRANG_LOAD:-on}" != off ]; then BIN=$(abspath $(BIN)) setsid scripts/serve-load & echo $$! > $(LOAD_PID); fi; \
	cd $(DAGSTER_HOME_DIR) && $(abspath $(BIN))/dagster dev -w $(CURDIR)/workspace.yaml -h 127.0.0.1 -p $(PORT)

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
FAST_TESTS := tests/scheduling tests/pool tests/ledger tests/control tests/simulate $(wildcard tests/test_*.py)
test-fast: $(STAMP) postgres
	$(BIN)/python -m pytest -q -m "not stress" $(FAST_TESTS)

bench: $(STAMP) postgres
	$(BIN)/python bench/cycle_speed.py
	$(BIN)/python bench/placement_openb.py
	$(BIN)/python bench/ledger.py
	$(BIN)/python bench/dagster_admission.py

clean:
	rm -rf $(VENV) .xirang .pytest_cache .hypothesis
