"""Migrations: empty -> head -> base -> head, with data in the tables at every step, on SQLite and on
PostgreSQL; head matches the models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy import inspect as sa_inspect

from tests.ledger.ledger_helpers import alloc, drop_schema, new_schema, postgres_base_url, with_search_path
from xirang_platform.ledger import Ledger, LedgerError
from xirang_platform.ledger.db import alembic_config, current_revision, downgrade, make_engine, table_names, upgrade
from xirang_platform.ledger.tables import TABLES, ledger_registry
from xirang_platform.scheduling.model import Tier

PLACEMENT_TABLES = {"allocation_slices", "allocation_shares"}


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


def head(engine: Engine) -> str:
    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head() or ""


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def fill(ledger: Ledger) -> None:
    """Accounts and allocations in every state: committed, reserved, borrowed, released."""
    ledger.add_tenant("acme", 2000)
    ledger.add_project("acme", "vision", 2000)
    ledger.reserve(alloc("running", gpus=2, node="n0"))
    ledger.commit("running")
    ledger.reserve(alloc("lent", node="n1"))  # past the cap of 2.4 GPUs: borrowed
    ledger.reserve(alloc("done", tier=Tier.INFERENCE, milli=250, node="n1"))
    ledger.release("done")


def rows(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


def test_upgrade_downgrade_upgrade_with_data_in_the_tables(empty_engine: Engine) -> None:
    assert table_names(empty_engine) == []
    assert current_revision(empty_engine) is None
    assert head(empty_engine) >= "0002"

    upgrade(empty_engine)
    assert table_names(empty_engine) == sorted([*TABLES, "alembic_version"])
    assert current_revision(empty_engine) == head(empty_engine)
    ledger = Ledger(url_of(empty_engine), migrate=False)
    fill(ledger)
    placed = ledger.allocations()
    ledger.close()
    assert [a.id for a in placed] == ["running", "lent"]
    kept = (rows(empty_engine, "allocations"), rows(empty_engine, "entries"))
    assert kept[0] == 3

    # Down to 0001: the placements go, every other row stays.
    downgrade(empty_engine, "0001")
    assert set(table_names(empty_engine)) & PLACEMENT_TABLES == set()
    assert (rows(empty_engine, "allocations"), rows(empty_engine, "entries")) == kept

    # Up again over those rows: they are kept; a live row without a placement is refused by name,
    # released as before, and new allocations come back with theirs.
    upgrade(empty_engine)
    assert (rows(empty_engine, "allocations"), rows(empty_engine, "entries")) == kept
    ledger = Ledger(url_of(empty_engine), migrate=False)
    with pytest.raises(
        LedgerError, match="allocations lent, running were reserved before the ledger stored placements"
    ):
        ledger.allocations()
    assert [a.id for a in ledger.allocations(live=False)] == ["running", "lent", "done"]
    assert ledger.release("running") == ["lent"]  # lent returns, counted by its stored milli
    ledger.release("lent")
    assert ledger.allocations() == []
    fresh = alloc("fresh", gpus=2, node="n2")
    ledger.reserve(fresh)
    assert ledger.allocations() == [fresh]
    assert ledger.rebuild().ok
    ledger.close()

    downgrade(empty_engine, "base")
    assert table_names(empty_engine) == ["alembic_version"]
    assert current_revision(empty_engine) is None

    upgrade(empty_engine)  # and up again: the downgrade left nothing in the way
    assert current_revision(empty_engine) == head(empty_engine)
    ledger = Ledger(url_of(empty_engine), migrate=False)
    fill(ledger)
    assert ledger.allocations() == placed
    ledger.close()


def test_head_schema_is_exactly_the_models(empty_engine: Engine) -> None:
    upgrade(empty_engine)
    with empty_engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), ledger_registry.metadata)
    ignored = {"alembic_version"}
    assert [d for d in diff if not (d[0] == "remove_table" and d[1].name in ignored)] == []


def test_ledger_on_an_empty_database_migrates_itself(empty_engine: Engine) -> None:
    ledger = Ledger(url_of(empty_engine))
    ledger.add_tenant("acme", 1000)
    assert ledger.quota_book().tenants == {"acme": 1000}
    ledger.close()
    assert current_revision(empty_engine) == head(empty_engine)


def test_checkpoint_times_go_down_to_0004_and_come_back_empty(empty_engine: Engine) -> None:
    upgrade(empty_engine)
    ledger = Ledger(url_of(empty_engine), migrate=False)
    fill(ledger)
    ledger.checkpointed_many({"running": 500.0})
    assert {a.id: a.checkpointed_at for a in ledger.allocations()} == {"running": 500.0, "lent": None}
    ledger.close()
    kept = (rows(empty_engine, "allocations"), rows(empty_engine, "entries"))

    downgrade(empty_engine, "0004")
    assert (rows(empty_engine, "allocations"), rows(empty_engine, "entries")) == kept
    with empty_engine.connect() as conn:
        columns = [c["name"] for c in sa_inspect(conn).get_columns("allocations")]
    assert "checkpointed_at" not in columns

    upgrade(empty_engine)  # rows from before the column reported no checkpoint
    ledger = Ledger(url_of(empty_engine), migrate=False)
    assert {a.id: a.checkpointed_at for a in ledger.allocations()} == {"running": None, "lent": None}
    ledger.close()
