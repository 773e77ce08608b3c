"""The ledger opened by a reader that must not change it (the exporter, the usage report): no
migration, and a clear error when the database is unreachable, empty, or at a schema this release
does not know (a newer one) or has not reached (an older one)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from xirang_platform.ledger.balances import AccountView
from xirang_platform.ledger.counters import AllocatedMilli, EventCount, allocated_milli, event_counts
from xirang_platform.ledger.db import alembic_config, current_revision, ledger_url
from xirang_platform.ledger.errors import LedgerError
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.ledger.tables import ACCOUNTS


class LedgerUnavailable(LedgerError):
    """The ledger cannot be read: unreachable, empty, or at another schema revision."""


def open_for_reading(url: str | None = None) -> Ledger:
    """The ledger at `url` (default: `XIRANG_LEDGER_URL`, else the local SQLite file), checked readable.
    A SQLite file that does not exist is refused, not created."""
    url = ledger_url(url)
    parsed = make_url(url)
    local_file = parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")
    if local_file and not Path(str(parsed.database)).is_file():
        raise LedgerUnavailable(
            f"no quota ledger at {url} (no such file): point --ledger-url (or XIRANG_LEDGER_URL) at the "
            f"ledger the platform writes"
        )
    ledger = Ledger(url, migrate=False)
    try:
        check_readable(ledger)
    except LedgerUnavailable:
        ledger.close()
        raise
    return ledger


def check_readable(ledger: Ledger) -> None:
    """Raise `LedgerUnavailable` unless `ledger`'s database answers at this release's schema revision."""
    where = _shown(ledger.url)
    try:
        revision = current_revision(ledger.engine)
    except DBAPIError as e:
        first = str(e.orig).strip().splitlines()[0] if e.orig is not None else str(e)
        raise LedgerUnavailable(
            f"cannot reach the quota ledger at {where} ({first}): start its database, or point --ledger-url "
            f"(or XIRANG_LEDGER_URL) at the ledger the platform writes"
        ) from None
    script = ScriptDirectory.from_config(alembic_config(ledger.engine))
    head = script.get_current_head()
    if revision is None:
        raise LedgerUnavailable(
            f"no quota ledger at {where} (the database has no ledger schema): point --ledger-url (or "
            f"XIRANG_LEDGER_URL) at the ledger the platform writes"
        )
    try:
        known = script.get_revision(revision) is not None
    except CommandError:
        known = False
    if not known:
        raise LedgerUnavailable(
            f"the quota ledger at {where} is at schema revision {revision}, newer than this release knows "
            f"(head {head}): upgrade xirang to the release that wrote it"
        )
    if revision != head:
        raise LedgerUnavailable(
            f"the quota ledger at {where} is at schema revision {revision}, older than this release's {head}: "
            f"run the platform (or `xirang quota show`) once to migrate it, then read it again"
        )


@dataclass(frozen=True)
class LedgerFigures:
    """What the exporter reads from the ledger, in one read: accounts, live holdings, event counts."""

    accounts: list[AccountView]
    held: list[AllocatedMilli]
    events: list[EventCount]


def read_figures(ledger: Ledger) -> LedgerFigures:
    """The ledger's accounts (by key), live milli and event counts, read in one transaction."""
    try:
        with ledger.engine.connect() as conn, conn.begin():
            rows = conn.execute(select(ACCOUNTS).order_by(ACCOUNTS.c.key)).all()
            return LedgerFigures([AccountView.from_row(r) for r in rows], allocated_milli(conn), event_counts(conn))
    except DBAPIError as e:
        first = str(e.orig).strip().splitlines()[0] if e.orig is not None else str(e)
        raise LedgerUnavailable(f"reading the quota ledger at {_shown(ledger.url)} failed ({first})") from None


def _shown(url: str) -> str:
    """The URL without its password."""
    return make_url(url).render_as_string(hide_password=True)
