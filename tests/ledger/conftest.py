"""Real databases for the ledger suite: a SQLite file and a fresh PostgreSQL schema per test run.

PostgreSQL comes from `XIRANG_TEST_POSTGRES_URL` (default the server on 127.0.0.1:5432). When it is
unreachable the PostgreSQL tests FAIL, saying how to start it: they are never skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from tests.ledger.ledger_helpers import Ticker, drop_schema, new_schema, postgres_base_url, wipe, with_search_path
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.db import make_engine, upgrade
from xirang_platform.scheduling.quota import OvercommitPolicy

START_PG = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    """An engine on the test PostgreSQL server; fails (never skips) when it is down."""
    url = postgres_base_url()
    engine = create_engine(url)
    problem = ""
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as e:  # noqa: BLE001 - any connection failure means the same fix
        lines = str(e).strip().splitlines()
        problem = f"{type(e).__name__}: {lines[0] if lines else e}"
    if problem:
        engine.dispose()
        pytest.fail(
            f"PostgreSQL at {make_url(url).render_as_string()} is unreachable ({problem}). Start it with "
            f"`{START_PG}` or point XIRANG_TEST_POSTGRES_URL at a running server.",
            pytrace=False,
        )
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def postgres_url(pg_admin: Engine) -> Iterator[str]:
    """A fresh schema for this test run, migrated to head; dropped afterwards."""
    schema = new_schema(pg_admin)
    url = with_search_path(postgres_base_url(), schema)
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    yield url
    drop_schema(pg_admin, schema)


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite file for this test run, migrated to head."""
    path: Path = tmp_path_factory.mktemp("ledger") / "ledger.sqlite"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture(params=BACKENDS)
def backend_url(request: pytest.FixtureRequest) -> str:
    """The migrated database of one backend (the test runs once per backend)."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def make_ledger(backend_url: str) -> Iterator[Callable[..., Ledger]]:
    """Build empty ledgers on the test's backend (closed after the test)."""
    made: list[Ledger] = []

    def make(policy: OvercommitPolicy | None = None) -> Ledger:
        ledger = Ledger(backend_url, policy=policy, clock=Ticker(), migrate=False)
        wipe(ledger)
        made.append(ledger)
        return ledger

    yield make
    for ledger in made:
        ledger.close()


@pytest.fixture
def ledger(make_ledger: Callable[..., Ledger]) -> Ledger:
    """An empty ledger on the test's backend."""
    return make_ledger()
