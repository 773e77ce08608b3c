"""`scripts/ensure-postgres` reads the one variable the tests read, XIRANG_TEST_POSTGRES_URL."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from tests.ledger.ledger_helpers import postgres_base_url

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure-postgres"


def run_script(url: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"XIRANG_TEST_POSTGRES_URL": url}
    return subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, check=False)


@pytest.mark.postgres
def test_the_database_the_url_names_is_created(pg_admin: Engine) -> None:
    name = f"xirang_ensure_{uuid.uuid4().hex[:12]}"
    url = make_url(postgres_base_url()).set(database=name).render_as_string(hide_password=False)
    try:
        done = run_script(url)
        assert done.returncode == 0, done.stderr
        with pg_admin.connect() as conn:
            found = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar()
        assert found == 1
        assert run_script(url).returncode == 0  # a second run finds it and changes nothing
    finally:
        with pg_admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))


def test_a_url_that_is_not_postgresql_is_refused_naming_the_variable() -> None:
    done = run_script("sqlite:///x.sqlite")
    assert done.returncode == 1
    assert "XIRANG_TEST_POSTGRES_URL='sqlite:///x.sqlite' is not a postgresql:// URL" in done.stderr
