# Two commands on a fresh machine (README.md): `make run` runs the main job, `make test` runs the lint
# and the tests. Both create .venv and install the project on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench postgres clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/xirang simulate --report out/replay
	$(BIN)/xirang simulate --mode fill --placement xirang --seed 42

postgres:
	scripts/ensure-postgres

# Lint, format and types: the settings are in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy xirang_platform resources sensors

test: lint postgres
	$(BIN)/python -m pytest -q

bench: $(STAMP) postgres
	$(BIN)/python bench/cycle_speed.py
	$(BIN)/python bench/placement_openb.py
	$(BIN)/python bench/ledger.py

clean:
	rm -rf $(VENV) .xirang .pytest_cache .hypothesis
