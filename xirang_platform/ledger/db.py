"""Where the ledger lives: the URL, the engine, and the alembic migrations.

`XIRANG_LEDGER_URL` names the database; unset, the ledger is the SQLite file
`./.xirang/ledger.sqlite`. Production uses `postgresql+psycopg2://...`.

SQLite serialises writers: every transaction starts with `BEGIN IMMEDIATE`, which takes the write
lock at once (not at the first write), so a read-check-write transaction can never interleave with
another writer; `busy_timeout` makes a second process wait for the lock instead of failing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, inspect

from xirang_platform.ledger.errors import LedgerError

URL_ENV = "XIRANG_LEDGER_URL"
DEFAULT_SQLITE_PATH = Path(".xirang") / "ledger.sqlite"
MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def ledger_url(url: str | None = None) -> str:
    """The ledger URL: `url`, else `XIRANG_LEDGER_URL`, else the default SQLite file (its folder created)."""
    url = url or os.environ.get(URL_ENV) or ""
    if url:
        return url
    DEFAULT_SQLITE_PATH.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{DEFAULT_SQLITE_PATH}"


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite ones begin every transaction with `BEGIN IMMEDIATE`."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _serialise_sqlite_writers(engine)
        return engine
    if url.startswith("postgresql"):
        # values_plus_batch: an executemany of UPDATEs is one round trip, not one per row.
        return create_engine(url, executemany_mode="values_plus_batch")
    raise LedgerError(
        f"unsupported ledger URL '{url}': use sqlite:///PATH or postgresql+psycopg2://USER@HOST:PORT/DB (set {URL_ENV})"
    )


def _serialise_sqlite_writers(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event, not pysqlite, decide when a transaction starts.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def alembic_config(engine: Engine) -> Config:
    """An alembic config for the packaged migrations, bound to `engine` (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the ledger schema up to `revision` (creating it on an empty database)."""
    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    """Migrate the ledger schema down to `revision` (`base` drops every ledger table)."""
    command.downgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None for an empty database)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def table_names(engine: Engine) -> list[str]:
    """The tables in the database (in the connection's default schema), sorted."""
    return sorted(inspect(engine).get_table_names())
