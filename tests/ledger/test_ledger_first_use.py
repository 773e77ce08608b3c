"""Concurrent first use of a fresh database (issue 10, item 10).

Several processes that each find an empty database at the same moment all try to create the schema;
before the migration lock, one in three trials on PostgreSQL failed with a UniqueViolation on
`alembic_version` and that process's tenant was never added. Here the processes are real (fork),
released together by a barrier right before they open the ledger, each adding its own tenant.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.ledger.ledger_helpers import drop_schema, new_schema, postgres_base_url, with_search_path
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.db import current_revision, make_engine

PROCESSES = 6
TRIALS = 3


def _add_tenant(url: str, name: str, start: mp.synchronize.Barrier, errors: mp.Queue) -> None:
    start.wait()
    try:
        ledger = Ledger(url)
        ledger.add_tenant(name, 1000)
        ledger.close()
    except Exception as e:  # noqa: BLE001 - reported to the test, which shows it
        errors.put(f"{name}: {type(e).__name__}: {e}")


def first_use_at_once(url: str) -> list[str]:
    """PROCESSES processes open the ledger at `url` at the same moment; each adds one tenant."""
    ctx = mp.get_context("fork")
    start, errors = ctx.Barrier(PROCESSES), ctx.Queue()
    workers = [ctx.Process(target=_add_tenant, args=(url, f"t{i}", start, errors)) for i in range(PROCESSES)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    found = []
    while not errors.empty():
        found.append(errors.get())
    return found + [f"exit code {w.exitcode}" for w in workers if w.exitcode != 0]


def check_every_tenant_added(url: str) -> None:
    ledger = Ledger(url, migrate=False)
    assert sorted(ledger.quota_book().tenants) == sorted(f"t{i}" for i in range(PROCESSES))
    assert ledger.rebuild().ok
    ledger.close()
    engine = make_engine(url)
    assert current_revision(engine) is not None
    engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("trial", range(TRIALS))
def test_processes_that_find_a_fresh_postgres_schema_at_once_all_succeed(pg_admin: Engine, trial: int) -> None:
    schema = new_schema(pg_admin, "xirang_ledger_first_use")
    url = with_search_path(postgres_base_url(), schema)
    try:
        assert first_use_at_once(url) == []
        check_every_tenant_added(url)
    finally:
        drop_schema(pg_admin, schema)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_processes_that_find_a_fresh_sqlite_file_at_once_all_succeed(tmp_path: Path, trial: int) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    assert first_use_at_once(url) == []
    check_every_tenant_added(url)
