"""The scheduling tick's lease: one tick writes at a time (DESIGN.md section 6).

A tick holds the lease from its first read to its last write; a second tick (another daemon, a
tick that overlaps a slow one) finds it taken and skips, writing nothing. The lease dies with its
holder, so a crashed tick's successor is never locked out:

- PostgreSQL: a session advisory lock keyed by the schema (`pg_try_advisory_lock`), on a
  connection of its own, unlocked when the tick ends (the connection ended instead when it cannot
  unlock); the server drops it when the session ends, and TCP keepalives bound how long a vanished
  host's session lives.
- SQLite: an exclusive `flock` of `ledger.sqlite.tick.lock` beside the database file (never the
  file itself, `db.sqlite_lock_path`); the kernel drops it when the process ends.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, text

from xirang_platform.ledger.db import sqlite_lock_path

TICK_LEASE_CLASS = 0x58524E54  # advisory lock class of the tick lease ("XRNT"); the key is the schema
# A vanished host's session (no FIN, no RST) is ended after about idle + interval x count seconds.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 10, 5, 3


@contextmanager
def tick_lease(engine: Engine) -> Iterator[str]:
    """Hold the tick lease of the ledger on `engine` while the block runs, without waiting: yields
    '' when this tick holds it, else why not (then write nothing)."""
    if engine.dialect.name == "postgresql":
        with _postgres_lease(engine) as busy:
            yield busy
        return
    database = engine.url.database
    if engine.dialect.name != "sqlite" or database in (None, "", ":memory:"):
        yield ""  # one process holds an in-memory database: nobody to take turns with
        return
    with _file_lease(sqlite_lock_path(str(database), "tick")) as busy:
        yield busy


BUSY = (
    "another scheduling tick holds the ledger's tick lease (a tick of another daemon, or one still "
    "running): this one writes nothing and the next tick decides again"
)


@contextmanager
def _file_lease(path: Path) -> Iterator[str]:
    with open(path, "ab") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield f"{BUSY} ({path})"
            return
        try:
            yield ""
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _postgres_lease(engine: Engine) -> Iterator[str]:
    key = {"cls": TICK_LEASE_CLASS}
    conn = engine.connect()
    held = False
    try:
        conn.execute(text(f"SET tcp_keepalives_idle = {KEEPALIVE_IDLE_S}"))
        conn.execute(text(f"SET tcp_keepalives_interval = {KEEPALIVE_INTERVAL_S}"))
        conn.execute(text(f"SET tcp_keepalives_count = {KEEPALIVE_COUNT}"))
        held = bool(conn.execute(text("SELECT pg_try_advisory_lock(:cls, hashtext(current_schema()))"), key).scalar())
        conn.commit()  # the advisory lock is the session's: it outlives this transaction
        yield "" if held else BUSY
    finally:
        try:
            if held:
                conn.execute(text("SELECT pg_advisory_unlock(:cls, hashtext(current_schema()))"), key)
                conn.commit()
        except Exception:  # noqa: BLE001 - a session that cannot unlock is ended, which releases the lease
            conn.invalidate()
        conn.close()
