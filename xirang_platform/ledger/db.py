"""Where the ledger lives: the URL, the engine, and the alembic migrations.

`XIRANG_LEDGER_URL` names the database; unset, the ledger is the SQLite file
`./.xirang/ledger.sqlite`. Production uses `postgresql+psycopg2://...`.

SQLite serialises writers: every transaction starts with `BEGIN IMMEDIATE`, which takes the write
lock at once (not at the first write), so a read-check-write transaction can never interleave with
another writer; `busy_timeout` makes a second process wait for the lock instead of failing.

PostgreSQL bounds every wait: each session sets `lock_timeout` (a writer waiting longer than that for
a row another transaction holds gets `LedgerBusy`, a retryable error, instead of waiting forever) and
`idle_in_transaction_session_timeout` (the server ends a session that stalls inside a transaction, a
stopped or hung writer, and its locks go with it). Migrations take an advisory lock per schema, so
processes that all find a fresh database at once migrate it one after the other.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import ExceptionContext

from xirang_platform.ledger.errors import LedgerBusy, LedgerError

URL_ENV = "XIRANG_LEDGER_URL"
DEFAULT_SQLITE_PATH = Path(".xirang") / "ledger.sqlite"
MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
# A ledger transaction holds its rows for milliseconds; waiting 10 s means something is stuck.
PG_LOCK_TIMEOUT_MS = 10_000
# A writer idle inside a transaction this long is stalled (stopped, hung): the server ends its session.
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
PG_LOCK_NOT_AVAILABLE = "55P03"
PG_IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
MIGRATION_LOCK_CLASS = 0x58524E47  # advisory lock class of ledger migrations ("XRNG"); the key is the schema


def ledger_url(url: str | None = None) -> str:
    """The ledger URL: `url`, else `XIRANG_LEDGER_URL`, else the default SQLite file (its folder created)."""
    url = url or os.environ.get(URL_ENV) or ""
    if url:
        return url
    DEFAULT_SQLITE_PATH.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{DEFAULT_SQLITE_PATH}"


def make_engine(url: str, *, lock_timeout_ms: int | None = None, idle_timeout_ms: int | None = None) -> Engine:
    """An engine for `url`; SQLite ones begin every transaction with `BEGIN IMMEDIATE`, PostgreSQL
    sessions wait at most `lock_timeout_ms` for a lock and `idle_timeout_ms` idle in a transaction
    (defaults `PG_LOCK_TIMEOUT_MS`, `PG_IDLE_IN_TRANSACTION_TIMEOUT_MS`)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _serialise_sqlite_writers(engine)
        return engine
    if url.startswith("postgresql"):
        # values_plus_batch: an executemany of UPDATEs is one round trip, not one per row.
        engine = create_engine(url, executemany_mode="values_plus_batch")
        _bound_postgres_waits(
            engine,
            PG_LOCK_TIMEOUT_MS if lock_timeout_ms is None else lock_timeout_ms,
            PG_IDLE_IN_TRANSACTION_TIMEOUT_MS if idle_timeout_ms is None else idle_timeout_ms,
        )
        return engine
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
            _enable_wal(cursor)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _enable_wal(cursor: Any) -> None:
    """Switch the file to write-ahead logging, waiting out other connections as `busy_timeout` would.

    SQLite does not call its busy handler for a journal-mode change, so processes that open a fresh
    file at the same moment get "database is locked" at once; retry until the busy timeout instead."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.25)


def _bound_postgres_waits(engine: Engine, lock_timeout_ms: int, idle_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET lock_timeout = {int(lock_timeout_ms)}")
        cursor.execute(f"SET idle_in_transaction_session_timeout = {int(idle_timeout_ms)}")
        cursor.close()
        dbapi_connection.commit()

    @event.listens_for(engine, "handle_error")
    def _busy(context: ExceptionContext) -> None:
        code = getattr(context.original_exception, "pgcode", None)
        if code == PG_LOCK_NOT_AVAILABLE:
            raise LedgerBusy(
                f"the quota ledger is busy: another transaction has held the rows this one needs for more than "
                f"{lock_timeout_ms / 1000:g} s (lock_timeout), so nothing was written; retry. If it keeps "
                "happening, look for a stalled writer: pg_stat_activity, state 'idle in transaction'"
            ) from context.sqlalchemy_exception
        # A session the server ended for idling in a transaction sees the timeout's code, or, when the
        # client reads the closed socket first, a disconnect. Either way the transaction was rolled
        # back; only a lost COMMIT leaves it unknown whether it was written.
        lost = context.is_disconnect and context.statement is not None and context.statement.upper() != "COMMIT"
        if code == PG_IDLE_IN_TRANSACTION_TIMEOUT or lost:
            raise LedgerBusy(
                "this ledger session lost its connection inside a transaction: it stayed idle for more than "
                f"{idle_timeout_ms / 1000:g} s and the server ended it (idle_in_transaction_session_timeout), "
                "or the server restarted; the transaction was rolled back, nothing of it was written; retry"
            ) from context.sqlalchemy_exception


def alembic_config(engine: Engine) -> Config:
    """An alembic config for the packaged migrations, bound to `engine` (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Migrate the ledger schema up to `revision` (creating it on an empty database); return the
    revision it was at before (None: the database was empty, the ledger was just created)."""
    with migration_lock(engine):
        before = current_revision(engine)
        command.upgrade(alembic_config(engine), revision)
    return before


def downgrade(engine: Engine, revision: str = "base") -> None:
    """Migrate the ledger schema down to `revision` (`base` drops every ledger table)."""
    with migration_lock(engine):
        command.downgrade(alembic_config(engine), revision)


@contextmanager
def migration_lock(engine: Engine) -> Iterator[None]:
    """Hold the ledger's migration lock of this schema (PostgreSQL advisory lock) while migrating.

    Without it, processes that find a fresh database at the same moment all create the schema and
    all but one fail on `alembic_version` (or on a column another one just added). On a SQLite file
    the lock is an exclusive `flock` of `ledger.sqlite.lock` beside it (`sqlite_lock_path`).
    The wait for the lock is not bounded by `lock_timeout`: a long migration is worth waiting for."""
    if engine.dialect.name == "sqlite":
        with _sqlite_file_lock(engine.url.database):
            yield
        return
    if engine.dialect.name != "postgresql":
        yield
        return
    key = text("SELECT :cls, hashtext(current_schema())").bindparams(cls=MIGRATION_LOCK_CLASS)
    with engine.connect() as conn:
        cls, schema_key = conn.execute(key).one()
        conn.execute(text("SET LOCAL lock_timeout = 0"))
        conn.execute(text("SELECT pg_advisory_lock(:c, :k)"), {"c": cls, "k": schema_key})
        conn.commit()  # the advisory lock is the session's: it outlives this transaction
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:c, :k)"), {"c": cls, "k": schema_key})
            conn.commit()


def sqlite_lock_path(database: str, purpose: str = "") -> Path:
    """The lock file beside the SQLite file `database`: `ledger.sqlite.lock` (migrations) or
    `ledger.sqlite.<purpose>.lock`. Never the database file itself: closing any handle of a file
    drops every POSIX lock the process holds on it, SQLite's own included, so a lock taken by
    opening the database would let another process delete the live `-wal` and `-shm` files."""
    return Path(f"{database}.{purpose}.lock" if purpose else f"{database}.lock")


@contextmanager
def _sqlite_file_lock(database: str | None) -> Iterator[None]:
    """Hold an exclusive `flock` on the lock file beside the SQLite file `database` (nothing for an
    in-memory database)."""
    if database in (None, "", ":memory:") or not Path(str(database)).parent.is_dir():
        yield  # nothing to lock: SQLite itself says why it cannot open the file
        return
    with open(sqlite_lock_path(str(database)), "ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None for an empty database)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def table_names(engine: Engine) -> list[str]:
    """The tables in the database (in the connection's default schema), sorted."""
    return sorted(inspect(engine).get_table_names())
