"""Migrations: empty -> head -> base on SQLite and on PostgreSQL, and head matches the models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from ledger_helpers import drop_schema, new_schema, postgres_base_url, with_search_path
from sqlalchemy import Engine

from xirang_platform.ledger import Ledger
from xirang_platform.ledger.db import current_revision, downgrade, make_engine, table_names, upgrade
from xirang_platform.ledger.tables import TABLES, ledger_registry


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on an empty database: a new SQLite file, or a new PostgreSQL schema (dropped after)."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'empty.sqlite'}")
        yield engine
        engine.dispose()
        return
    admin = request.getfixturevalue("pg_admin")
    schema = new_schema(admin, "xirang_ledger_migration")
    engine = make_engine(with_search_path(postgres_base_url(), schema))
    yield engine
    engine.dispose()
    drop_schema(admin, schema)


def test_upgrade_from_empty_to_head_and_downgrade_back(empty_engine: Engine) -> None:
    assert table_names(empty_engine) == []
    assert current_revision(empty_engine) is None

    upgrade(empty_engine)
    assert table_names(empty_engine) == sorted([*TABLES, "alembic_version"])
    assert current_revision(empty_engine) == "0001"

    downgrade(empty_engine, "base")
    assert table_names(empty_engine) == ["alembic_version"]
    assert current_revision(empty_engine) is None

    upgrade(empty_engine)  # and up again: the downgrade left nothing in the way
    assert current_revision(empty_engine) == "0001"


def test_head_schema_is_exactly_the_models(empty_engine: Engine) -> None:
    upgrade(empty_engine)
    with empty_engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), ledger_registry.metadata)
    ignored = {"alembic_version"}
    assert [d for d in diff if not (d[0] == "remove_table" and d[1].name in ignored)] == []


def test_ledger_on_an_empty_database_migrates_itself(empty_engine: Engine) -> None:
    ledger = Ledger(empty_engine.url.render_as_string(hide_password=False))
    ledger.add_tenant("acme", 1000)
    assert ledger.quota_book().tenants == {"acme": 1000}
    ledger.close()
    assert current_revision(empty_engine) == "0001"
