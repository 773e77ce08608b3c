"""Alembic environment of the ledger: runs on the engine `db.alembic_config` hands over."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from xirang_platform.ledger.tables import ledger_registry

target_metadata = ledger_registry.metadata
config = context.config


def run_migrations_online() -> None:
    """Run the migrations in one transaction on the configured engine."""
    engine = config.attributes.get("engine") or create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    raise SystemExit("the ledger migrations run online only: use xirang_platform.ledger.db.upgrade(engine)")
run_migrations_online()
